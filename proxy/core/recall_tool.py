"""The recall tool as a model reads it: its name, what it says it does, its one argument,
and what its answer says (the excerpts it found, framed as recall's excerpts are).

The name is one no client is likely to declare; a client that does declare it keeps its
own tool, and the proxy adds nothing (compaction/recall_tool.py). The answer quotes the
archived passages verbatim inside the excerpts' frame (core/excerpts.py), whose marker
no quoted text can close: what the model reads there is data, not instructions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.excerpts import render_excerpts
from proxy.core.passages import Passage
from proxy.core.wording import HANDOFF_INTRO
from proxy.types import ChatMessage

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
        },
        "section": {
            "type": "string",
            "description": "Or a heading of the summary: the messages it was written from.",
        },
    },
}
# What the definition costs in a request's tokens, at most (any common tokenizer, as a
# JSON schema or a chat template renders it: tests/core/test_recall_tool.py counts).
TOOL_TOKENS = 160
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


def query_of(arguments: str, summary: str = "") -> str:
    """The query a call's arguments ask for: its ``query`` string; a ``section`` of
    ``summary`` (the view's) opened: that section's own words, which its sources share
    (``section_of``); else the arguments' own text (a model that wrote them loosely). At
    most ``MAX_QUERY_CHARS``."""
    if len(arguments) > _MAX_ARGUMENTS_CHARS:  # no query is that long: read as words
        return arguments[:MAX_QUERY_CHARS]
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments[:MAX_QUERY_CHARS]
    if not isinstance(parsed, dict):
        return arguments[:MAX_QUERY_CHARS]
    query = parsed.get("query")
    section = parsed.get("section")
    words = query if isinstance(query, str) and query.strip() else ""
    if isinstance(section, str) and section.strip():
        words = f"{words}\n{section_of(summary, section)}".strip()
    return (words or arguments)[:MAX_QUERY_CHARS]


_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")


def section_of(summary: str, heading: str) -> str:
    """The section of ``summary`` under the Markdown heading that reads ``heading``
    (case, leading hashes and spaces aside; else the first that starts with it): its
    heading and lines up to the next heading. ``heading`` itself when none matches."""
    wanted = heading.strip().lstrip("#").strip().casefold()[:200]
    lines = summary.splitlines()
    titles = [
        (i, m.group(1).casefold()) for i, line in enumerate(lines) if (m := _HEADING.match(line))
    ]
    found = next((i for i, t in titles if t == wanted), None)
    if found is None:
        found = next((i for i, t in titles if wanted and t.startswith(wanted)), None)
    if found is None:
        return heading[:MAX_QUERY_CHARS]
    end = next((i for i, _ in titles if i > found), len(lines))
    return "\n".join(lines[found:end])


def tool_result(passages: Sequence[Passage]) -> str:
    """The answer to one call: the passages found, framed as excerpts, or that none is."""
    return render_excerpts(passages) if passages else NOTHING_FOUND


def view_summary(messages: Sequence[ChatMessage] | None) -> str:
    """The summary a view carries (its handoff's ``<summary>``), or ``""``."""
    for message in messages or ():
        content = message.get("content")
        if isinstance(content, str) and content.startswith(HANDOFF_INTRO):
            inner = content.partition("<summary>\n")[2]
            return inner.rpartition("\n</summary>")[0] or inner
    return ""
