"""The recall tool as a model reads it: its name, what it says it does, its one argument,
and what its answer says (the excerpts it found, framed as recall's excerpts are).

The name is one no client is likely to declare; a client that does declare it keeps its
own tool, and the proxy adds nothing (compaction/recall_tool.py). The answer quotes the
archived passages verbatim inside the excerpts' frame (core/excerpts.py), whose marker
no quoted text can close: what the model reads there is data, not instructions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.excerpts import render_excerpts
from proxy.core.passages import Passage

TOOL_NAME = "compaction_proxy_recall"
TOOL_DESCRIPTION = (
    "Search the earlier part of this conversation, which has been summarized, for the "
    "verbatim messages about something: a name, a value, an identifier, a decision. Use it "
    "when the summary does not state what you need. Returns quoted excerpts."
)
TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "What to look for: the words or identifiers it was said in.",
        }
    },
    "required": ["query"],
}
# What the definition costs in a request's tokens, at most (any common tokenizer, as a
# JSON schema or a chat template renders it: tests/core/test_recall_tool.py counts).
TOOL_TOKENS = 140
# A call's arguments beyond this many characters are read no further (a query is words).
MAX_QUERY_CHARS = 1000
_MAX_ARGUMENTS_CHARS = 64 * 1024
NOTHING_FOUND = "No earlier message of this conversation matches that query."


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a tool in a model's answer: its id, its name, its arguments' text."""

    id: str
    name: str
    arguments: str


def query_of(arguments: str) -> str:
    """The query a call's arguments ask for: its ``query`` string, else the arguments'
    own text (a model that wrote them loosely), at most ``MAX_QUERY_CHARS``."""
    if len(arguments) > _MAX_ARGUMENTS_CHARS:  # no query is that long: read as words
        return arguments[:MAX_QUERY_CHARS]
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments[:MAX_QUERY_CHARS]
    if isinstance(parsed, dict) and isinstance(parsed.get("query"), str):
        return str(parsed["query"])[:MAX_QUERY_CHARS]
    return arguments[:MAX_QUERY_CHARS]


def tool_result(passages: Sequence[Passage]) -> str:
    """The answer to one call: the passages found, framed as excerpts, or that none is."""
    return render_excerpts(passages) if passages else NOTHING_FOUND
