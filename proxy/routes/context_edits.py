"""Anthropic's ``context_management`` edits, carried out by the proxy for an upstream that
lacks them (``upstream.compaction: proxy``, or ``auto`` in front of anything but
api.anthropic.com): read as the API reads them, applied to the view the proxy sends.

* ``clear_thinking_20251015``: the thinking blocks of all but the newest ``keep`` assistant
  turns (default 1; ``"all"``: none cleared) are left out. A turn is what answers one
  message of the user's own: a tool loop's assistant messages are one turn, so the newest
  loop keeps the thinking the API requires of it.
* ``clear_tool_uses_20250919``: once the view passes ``trigger`` (input tokens, default
  100,000, or a count of tool uses), the results of all but the newest ``keep`` tool uses
  (default 3; ``exclude_tools`` never) are replaced by a placeholder, their inputs too
  under ``clear_tool_inputs``; nothing is cleared when that frees fewer than
  ``clear_at_least`` tokens. Applied after the thinking edit, whatever their order.
* ``compact_20260112``: the proxy's own compaction at ``trigger`` (input tokens, default
  150,000, at least 50,000), its summary returned as a ``compaction`` block
  (messages_answers.py, compaction_blocks.py).

Token figures here (the trigger of the clearing edit when the view went uncounted, the
tokens each edit cleared) are estimates at four bytes a token: the proxy counts the view,
not each block of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.errors import InvalidRequest
from proxy.routes.messages_chat import Message, blocks_of

CLEAR_TOOLS, CLEAR_THINKING, COMPACT = (
    "clear_tool_uses_20250919",
    "clear_thinking_20251015",
    "compact_20260112",
)
_TYPES = (CLEAR_TOOLS, CLEAR_THINKING, COMPACT)
MIN_COMPACT_TRIGGER = 50_000  # the API's floor
PLACEHOLDER = "[Tool result cleared to save context]"
_THINKING = ("thinking", "redacted_thinking")
_BYTES_PER_TOKEN = 4
_MAX_NAMES = 256  # exclude_tools, clear_tool_inputs: a client's list, bounded


_TOOLS_TRIGGER, _TOOLS_KEEP, _COMPACT_TRIGGER = ("input_tokens", 100_000), 3, 150_000


@dataclass(frozen=True, slots=True)
class ClearTools:
    trigger: tuple[str, int] = _TOOLS_TRIGGER
    keep: int = _TOOLS_KEEP
    clear_at_least: int = 0
    exclude: frozenset[str] = frozenset()
    inputs: bool | frozenset[str] = False


@dataclass(frozen=True, slots=True)
class Compact:
    trigger: int = _COMPACT_TRIGGER
    pause: bool = False
    instructions: str | None = None


@dataclass(frozen=True, slots=True)
class Edits:
    """The edits one request asks for (None: not asked); ``thinking_keep`` None keeps all."""

    thinking: bool = False
    thinking_keep: int | None = 1
    tools: ClearTools | None = None
    compact: Compact | None = None
    order: tuple[str, ...] = field(default=())


def _bad(message: str, param: str = "context_management") -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def read_edits(raw: object) -> Edits:
    """``context_management`` as the API reads it; raises InvalidRequest (the 400)."""
    if not isinstance(raw, dict):
        raise _bad("Input should be a valid dictionary")
    edits = raw.get("edits", [])
    if not isinstance(edits, list):
        raise _bad("Input should be a valid list", "context_management.edits")
    found: dict[str, Any] = {}
    for i, edit in enumerate(edits):
        where = f"context_management.edits.{i}"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in _TYPES:
            expected = ", ".join(f"'{t}'" for t in _TYPES)
            raise _bad(
                f"Input tag '{kind}' found using 'type' does not match any of the "
                f"expected tags: {expected}",
                f"{where}.type",
            )
        if kind in found:
            raise _bad(f"duplicate edit type '{kind}'", where)
        found[kind] = _one(kind, edit, where)
    return Edits(
        # Asked for with keep "all" (None) is asked for still: it clears nothing.
        thinking=CLEAR_THINKING in found,
        thinking_keep=found.get(CLEAR_THINKING, 1),
        tools=found.get(CLEAR_TOOLS),
        compact=found.get(COMPACT),
        order=tuple(found),
    )


def _one(kind: str, edit: dict[str, Any], where: str) -> Any:
    if kind == CLEAR_THINKING:
        return _keep_turns(edit.get("keep", {"type": "thinking_turns", "value": 1}), where)
    if kind == COMPACT:
        trigger = _amount(edit.get("trigger"), ("input_tokens",), f"{where}.trigger")
        value = trigger[1] if trigger else _COMPACT_TRIGGER
        if value < MIN_COMPACT_TRIGGER:
            raise _bad(
                f"Input should be greater than or equal to {MIN_COMPACT_TRIGGER}",
                f"{where}.trigger.value",
            )
        instructions = edit.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise _bad("Input should be a valid string", f"{where}.instructions")
        pause = edit.get("pause_after_compaction", False)
        if not isinstance(pause, bool):
            raise _bad("Input should be a valid boolean", f"{where}.pause_after_compaction")
        return Compact(value, pause, instructions or None)
    trigger = _amount(edit.get("trigger"), ("input_tokens", "tool_uses"), f"{where}.trigger")
    keep = _amount(edit.get("keep"), ("tool_uses",), f"{where}.keep", floor=0)
    least = _amount(edit.get("clear_at_least"), ("input_tokens",), f"{where}.clear_at_least")
    inputs = edit.get("clear_tool_inputs", False)
    return ClearTools(
        trigger or _TOOLS_TRIGGER,
        keep[1] if keep else _TOOLS_KEEP,
        least[1] if least else 0,
        _names(edit.get("exclude_tools"), f"{where}.exclude_tools") or frozenset(),
        inputs
        if isinstance(inputs, bool)
        else _names(inputs, f"{where}.clear_tool_inputs") or False,
    )


def _keep_turns(keep: object, where: str) -> int | None:
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return None
    amount = _amount(keep, ("thinking_turns",), f"{where}.keep", floor=0)
    return amount[1] if amount else 1


def _amount(
    raw: object, kinds: tuple[str, ...], where: str, floor: int = 1
) -> tuple[str, int] | None:
    """``{"type": kind, "value": n}`` (None: absent)."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    value = raw.get("value") if isinstance(raw, dict) else None
    if kind not in kinds:
        raise _bad(f"Input should be an object with 'type' one of {', '.join(kinds)}", where)
    if isinstance(value, bool) or not isinstance(value, int) or value < floor:
        raise _bad(f"Input should be an integer greater than or equal to {floor}", f"{where}.value")
    return str(kind), value


def _names(raw: object, where: str) -> frozenset[str] | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or len(raw) > _MAX_NAMES
        or not all(isinstance(n, str) for n in raw)
    ):
        raise _bad(f"Input should be a list of at most {_MAX_NAMES} strings", where)
    return frozenset(raw)


def _estimate(value: object) -> int:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return len(text.encode()) // _BYTES_PER_TOKEN


def clear_thinking(messages: list[Message], keep: int | None) -> tuple[list[Message], int, int]:
    """``messages`` without the thinking of all but the newest ``keep`` assistant turns
    (None: all kept); how many turns lost theirs and the tokens that freed (estimated)."""
    if keep is None:
        return messages, 0, 0
    turns = _turn_starts(messages)
    starts = set(turns)
    cut = turns[-keep] if 0 < keep <= len(turns) else (len(messages) if keep == 0 else 0)
    out, cleared, tokens, turn = list(messages), set(), 0, -1
    for i, message in enumerate(messages[:cut]):
        if i in starts:
            turn = i
        if message.get("role") != "assistant" or isinstance(message.get("content"), str):
            continue
        content = blocks_of(message.get("content"))
        kept = [b for b in content if b.get("type") not in _THINKING]
        if len(kept) == len(content) or not kept:  # none, or nothing left to send
            continue
        tokens += sum(_estimate(b) for b in content if b.get("type") in _THINKING)
        out[i] = {**message, "content": kept}
        cleared.add(turn)
    return out, len(cleared), tokens


def _turn_starts(messages: Sequence[Message]) -> list[int]:
    """Where each assistant turn starts: the first assistant message after a user message
    of the user's own (not only tool results)."""
    starts, open_ = [], True
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "user" and not _only_results(message):
            open_ = True
        elif role == "assistant" and open_:
            starts.append(i)
            open_ = False
    return starts


def _only_results(message: Message) -> bool:
    content = blocks_of(message.get("content"))
    return bool(content) and all(b.get("type") == "tool_result" for b in content)


def clear_tool_uses(
    messages: list[Message], edit: ClearTools, tokens: int
) -> tuple[list[Message], int, int] | None:
    """``messages`` with the older tool uses' results (and inputs) cleared, how many and
    the tokens that freed (estimated); None when the edit does not apply (below its
    trigger, nothing to clear, fewer tokens than ``clear_at_least``). ``tokens``: the
    view's input tokens."""
    uses = _tool_uses(messages)
    kind, value = edit.trigger
    if (tokens if kind == "input_tokens" else len(uses)) < value:
        return None
    eligible = [u for u in uses if str(u[2].get("name")) not in edit.exclude]
    chosen = eligible[: max(len(eligible) - edit.keep, 0)]
    ids = {str(u[2].get("id")) for u in chosen}
    out, freed = list(messages), 0
    for i, message in enumerate(messages):
        if message.get("role") == "user" and not isinstance(message.get("content"), str):
            cleared = _results_cleared(message, ids)
            if cleared is not None:
                out[i], freed = cleared[0], freed + cleared[1]
    freed += _clear_inputs(out, chosen, edit.inputs)
    if not chosen or freed < edit.clear_at_least:
        return None
    return out, len(chosen), freed


def _tool_uses(messages: Sequence[Message]) -> list[tuple[int, int, dict[str, Any]]]:
    """Each ``tool_use`` block, oldest first: its message's index, its own, the block."""
    return [
        (i, k, block)
        for i, message in enumerate(messages)
        if message.get("role") == "assistant"
        for k, block in enumerate(blocks_of(message.get("content")))
        if block.get("type") == "tool_use"
    ]


def _results_cleared(message: Message, ids: set[str]) -> tuple[Message, int] | None:
    """``message`` with its results of the tool uses ``ids`` cleared, and the tokens that
    freed; None: none of its results is one of them (or all were cleared already)."""
    content, freed = list(blocks_of(message.get("content"))), 0
    for k, block in enumerate(content):
        ours = block.get("type") == "tool_result" and str(block.get("tool_use_id")) in ids
        if ours and block.get("content") != PLACEHOLDER:
            freed += _estimate(block.get("content", ""))
            content[k] = {**block, "content": PLACEHOLDER}
    return ({**message, "content": content}, freed) if freed else None


def _clear_inputs(
    out: list[Message], chosen: list[tuple[int, int, dict[str, Any]]], which: bool | frozenset[str]
) -> int:
    freed = 0
    for i, k, block in chosen:
        if which is True or (isinstance(which, frozenset) and str(block.get("name")) in which):
            content = list(blocks_of(out[i].get("content")))
            freed += _estimate(block.get("input", {}))
            content[k] = {**content[k], "input": {}}
            out[i] = {**out[i], "content": content}
    return freed
