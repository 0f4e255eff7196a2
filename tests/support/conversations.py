"""Conversations from role scripts, for the planner and rebuild tests."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.history import History, result_flags
from proxy.core.plan import next_group_start
from proxy.types import ChatMessage, ToolCall


def convo(spec: str) -> list[ChatMessage]:
    """Messages from a role script: s d u a, ``cK`` = assistant with K tool calls, t = a result.

    A ``t`` with no call left to answer becomes an orphan tool message.
    """
    messages: list[ChatMessage] = []
    pending: list[str] = []
    for i, token in enumerate(spec.split()):
        if token in ("s", "d"):
            role = "system" if token == "s" else "developer"
            messages.append({"role": role, "content": f"{role} {i}"})
        elif token in ("u", "a"):
            role = "user" if token == "u" else "assistant"
            messages.append({"role": role, "content": f"{role} {i}"})
        elif token.startswith("c"):
            pending = [f"call_{i}_{k}" for k in range(int(token[1:]))]
            calls: list[ToolCall] = [
                {"id": cid, "type": "function", "function": {"name": "grep", "arguments": "{}"}}
                for cid in pending
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif token == "t":
            cid = pending.pop(0) if pending else "orphan"
            messages.append({"role": "tool", "tool_call_id": cid, "content": "x" * 99})
        else:
            raise AssertionError(token)
    return messages


def group_starts(results: Sequence[int], start: int) -> list[int]:
    """Every legal cut from ``start``, as ``next_group_start`` finds them one by one."""
    found: list[int] = []
    i = next_group_start(results, max(start, 0))
    while i is not None:
        found.append(i)
        i = next_group_start(results, i + 1)
    return found


def measured(messages: Sequence[ChatMessage], counts: Sequence[int], pinned: int) -> History:
    """The ``History`` of ``messages`` with these token counts (no digests, nothing fixed)."""
    return History(messages, [b""] * len(messages), counts, pinned, 0, result_flags(messages))
