"""Post-compaction regret, pure: tool calls a model makes again because a compaction took
their results out of its sight.

A view that drops part of the history (a summary's span, trimmed groups, elided
results) takes tool results with it. When the model's next calls repeat one of those
(the same tool, the same arguments, byte for byte), it is fetching again what the
compaction covered: that call is the compaction's cost, beside the tokens it saved.

``dropped`` is the set a view leaves out: the calls whose assistant message or whose
result is no longer in the view (by identity: the view holds the history's own message
objects where it keeps them). ``repeated`` counts the calls of new messages found in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from xxhash import xxh3_64_intdigest

from proxy.types import ChatMessage

# The most calls one view's dropped set keeps: a client chooses how many it makes.
MAX_DROPPED = 4096


def _call_key(call: Any) -> int | None:
    """A tool call's identity: its tool's name and its arguments, as sent."""
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    if not isinstance(function, dict):
        return None
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str):
        return None
    text = arguments if isinstance(arguments, str) else repr(arguments)
    return xxh3_64_intdigest(f"{name}\0{text}".encode())


def _calls(message: ChatMessage) -> Iterable[tuple[str | None, int]]:
    """An assistant message's tool calls: each one's id and identity."""
    if message.get("role") != "assistant":
        return ()
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ()
    found = []
    for call in calls:
        key = _call_key(call)
        if key is not None:
            call_id = call.get("id")
            found.append((call_id if isinstance(call_id, str) else None, key))
    return found


def dropped(history: Sequence[ChatMessage], view: Sequence[ChatMessage]) -> frozenset[int]:
    """The tool calls of ``history`` whose call or result ``view`` does not hold."""
    shown = {id(m) for m in view}
    results = {m.get("tool_call_id"): id(m) in shown for m in history if m.get("role") == "tool"}
    out: set[int] = set()
    for message in history:
        for call_id, key in _calls(message):
            if id(message) not in shown or not results.get(call_id, True):
                out.add(key)
                if len(out) >= MAX_DROPPED:
                    return frozenset(out)
    return frozenset(out)


def repeated(new: Sequence[ChatMessage], dropped_calls: frozenset[int]) -> int:
    """How many tool calls of ``new`` messages repeat one of ``dropped_calls``."""
    if not dropped_calls:
        return 0
    return sum(1 for m in new for _, key in _calls(m) if key in dropped_calls)
