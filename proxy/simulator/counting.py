"""Prompt token counting, close to how OpenAI bills chat prompts.

The rule, deterministic and documented rather than exact:

* every message costs 3 tokens of framing, plus the tokens of its role, its
  content (a string, or the text parts of a part list; each image or other
  non-text part a flat 85), its ``name`` (+1), and for each tool call the
  tokens of the function name and the arguments;
* 3 more tokens prime the reply;
* ``tools`` (and legacy ``functions``) count as the text of their JSON, or, for a
  model whose ``tool_format`` is ``hermes``, as Qwen2.5's and Hermes' chat templates
  render them into the system message: fixed instructions around one line per tool,
  the tool's JSON with Python's ``json.dumps`` spacing (jinja's ``tojson``).

Long strings repeat across the requests of one conversation, so their counts
are memoised in a bounded table; that keeps long benchmark runs cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.core.encodings import Encoder
from proxy.simulator.config import ToolFormat

PER_MESSAGE = 3
REPLY_PRIMING = 3
PER_NAME = 1
NON_TEXT_PART = 85

# Qwen2.5's chat template (tokenizer_config.json), around ``{{ tool | tojson }}`` lines.
HERMES_TOOLS_HEAD = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
HERMES_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

_MEMO_MIN_CHARS = 256
_MEMO_MAX_ENTRIES = 8192


@dataclass(frozen=True, slots=True)
class PromptCount:
    total: int
    tools: int  # the share of ``total`` spent on tool definitions


def text_of(content: object) -> str:
    """The text of a message's content: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or part.get("refusal") or "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "refusal")
        )
    return ""


class PromptCounter:
    """Counts request prompts with one encoder; one instance per tokenizer."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder
        # The simulator counts on its event loop only, so no lock around LRU reordering.
        self._memo: LRUCache[str, int] = LRUCache(_MEMO_MAX_ENTRIES)

    @property
    def encoder(self) -> Encoder:
        return self._encoder

    def text(self, text: str) -> int:
        if len(text) < _MEMO_MIN_CHARS:
            return self._encoder.count(text) if text else 0
        hit = self._memo.get(text)
        if hit is None:
            hit = self._memo[text] = self._encoder.count(text)
        return hit

    def content(self, content: object) -> int:
        if isinstance(content, str):
            return self.text(content)
        if not isinstance(content, list):
            return 0
        total = 0
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in ("text", "refusal"):
                total += self.text(str(part.get(kind) or ""))
            else:
                total += NON_TEXT_PART
        return total

    def message(self, message: dict[str, Any]) -> int:
        total = PER_MESSAGE + self.text(str(message.get("role", "")))
        total += self.content(message.get("content"))
        name = message.get("name")
        if isinstance(name, str):
            total += self.text(name) + PER_NAME
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    total += self.text(str(fn.get("name", "")))
                    total += self.text(str(fn.get("arguments", "")))
        return total

    def prompt(self, body: dict[str, Any], tool_format: ToolFormat = "json") -> PromptCount:
        messages = body.get("messages") or []
        total = REPLY_PRIMING + sum(self.message(m) for m in messages if isinstance(m, dict))
        tools = 0
        for key in ("tools", "functions"):
            defs = body.get(key)
            if defs and tool_format == "hermes" and isinstance(defs, list):
                lines = "".join("\n" + json.dumps(d, ensure_ascii=False) for d in defs)
                tools += self.text(HERMES_TOOLS_HEAD + lines + HERMES_TOOLS_TAIL)
            elif defs:
                tools += self.text(orjson.dumps(defs).decode())
        return PromptCount(total=total + tools, tools=tools)
