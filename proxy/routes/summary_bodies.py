"""A summary asked as the request itself, in each API's shape (``Api.summary_body``).

The summary call of a ``compaction.summary_prompt: cached`` compaction
(compaction/summary_prefix.py) sends what the conversation's last request sent, up to
the cut, and the summary instruction as a final user turn: the provider's prompt cache
serves the prefix. So everything that is part of that prefix is kept as the client sent
it: the system prompt, ``tools`` (OpenAI and Anthropic cache them first), ``tool_choice``
(Anthropic drops its messages cache when it changes: tool use is forbidden in words
instead), ``thinking`` and ``reasoning``, ``metadata``, ``prompt_cache_key``. What shapes
only the answer is the summary's: unstreamed, at most its own budget, temperature 0, no
structured output format; with Anthropic's thinking on, its ``budget_tokens`` besides
(``max_tokens`` must exceed them) and no temperature but the default. A request that
forces a tool call is not asked so: None, and the summarizer gets a transcript as before.

Anthropic reads a cached prefix only up to a ``cache_control`` breakpoint of the request:
the instruction's block carries one (a read there finds the longest prefix an earlier
request's breakpoint wrote), and the oldest of the client's own breakpoints in the
messages give way when that would make more than the four Anthropic accepts.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.routes.items import to_items
from proxy.routes.messages_chat import blocks_of, to_anthropic
from proxy.types import ChatMessage

# Fields that shape only the answer, never the prompt: the summary's own are set instead.
_CHAT_ANSWER = frozenset(
    (
        "stream",
        "stream_options",
        "n",
        "logprobs",
        "top_logprobs",
        "response_format",
        "prediction",
        "audio",
        "modalities",
        "max_completion_tokens",
        "store",  # the summary is the proxy's, not a completion the client keeps
    )
)
_RESPONSES_ANSWER = frozenset(("stream", "stream_options", "text", "background", "include"))
# The body, and the tokens it allows the answer (its own and, Anthropic's, thinking's);
# None: the request is not asked so.
Asked = tuple[bytes, int] | None
_MAX_BREAKPOINTS = 4  # Anthropic's, tools, system and messages together
_BREAKPOINT = {"type": "ephemeral"}


def forces_tool(choice: object) -> bool:
    """Whether a ``tool_choice`` (any API's) makes the model call a tool."""
    if choice is None or choice in ("auto", "none"):
        return False
    return not (isinstance(choice, dict) and choice.get("type") in ("auto", "none"))


def chat_summary(data: dict[str, Any], messages: list[ChatMessage], max_tokens: int) -> Asked:
    """A chat completions request asking for the summary after ``messages``."""
    if forces_tool(data.get("tool_choice")) or isinstance(data.get("function_call"), dict):
        return None
    body = {k: v for k, v in data.items() if k not in _CHAT_ANSWER}
    body.update(messages=messages, max_tokens=max_tokens, temperature=0, stream=False)
    return orjson.dumps(body), max_tokens


def responses_summary(data: dict[str, Any], messages: list[ChatMessage], max_tokens: int) -> Asked:
    """A Responses API request asking for the summary after ``messages`` (not stored:
    nothing chains on it)."""
    if forces_tool(data.get("tool_choice")):
        return None
    body = {k: v for k, v in data.items() if k not in _RESPONSES_ANSWER}
    body.update(input=to_items(messages), max_output_tokens=max_tokens, temperature=0)
    body.update(stream=False, store=False)
    return orjson.dumps(body), max_tokens


def messages_summary(data: dict[str, Any], messages: list[ChatMessage], max_tokens: int) -> Asked:
    """A Messages API request asking for the summary after ``messages``, with a
    breakpoint at the instruction (the newest message's last block)."""
    if forces_tool(data.get("tool_choice")):
        return None
    out = to_anthropic(messages)
    if not out:
        return None
    last = out[-1]
    blocks = list(blocks_of(last.get("content")))
    blocks[-1] = {**blocks[-1], "cache_control": _BREAKPOINT}
    out[-1] = {**last, "content": blocks}
    room = _MAX_BREAKPOINTS - _breakpoints(data.get("tools")) - _breakpoints(data.get("system"))
    out = _within(out, max(room, 1))
    allowed = max_tokens + thinking_budget(data)
    body = {k: v for k, v in data.items() if k != "stream"}
    body.update(messages=out, max_tokens=allowed, stream=False)
    if "thinking" not in body:  # thinking takes no temperature but its default
        body["temperature"] = 0
    return orjson.dumps(body), allowed


def thinking_budget(data: dict[str, Any]) -> int:
    """The tokens a Messages request's extended thinking may take (``budget_tokens``),
    which its ``max_tokens`` must exceed: a summary asked with thinking on is allowed
    them besides its own (turning thinking off or changing its budget would lose the
    messages' cache)."""
    thinking = data.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return 0
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else 0


def _breakpoints(blocks: object) -> int:
    if not isinstance(blocks, list):
        return 0
    return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)


def _within(messages: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """``messages`` with at most ``room`` breakpoints: the oldest dropped, in copies (the
    client's own messages are never changed). A breakpoint is no part of what is cached."""
    excess = sum(_breakpoints(m.get("content")) for m in messages) - room
    out = list(messages)
    for i, message in enumerate(out):
        if excess <= 0:
            break
        content = message.get("content")
        if not _breakpoints(content) or not isinstance(content, list):
            continue
        blocks = []
        for block in content:
            if excess > 0 and isinstance(block, dict) and "cache_control" in block:
                block = {k: v for k, v in block.items() if k != "cache_control"}
                excess -= 1
            blocks.append(block)
        out[i] = {**message, "content": blocks}
    return out
