"""Anthropic's ``context_management`` edits as the proxy carries them out (issue 37 item 7),
in process: what a request may ask for, the view each clearing edit makes, and the
``compaction`` block read back. End to end with the ``anthropic`` SDK:
tests/e2e/test_context_edits_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Settings
from proxy.errors import InvalidRequest
from proxy.routes.compaction_blocks import carries_compaction, compaction_block, expanded
from proxy.routes.compaction_items import Sealer
from proxy.routes.context_edits import (
    PLACEHOLDER,
    clear_thinking,
    clear_tool_uses,
    read_edits,
)
from proxy.routes.messages_chat import Message


def edit(kind: str, **fields: Any) -> dict[str, Any]:
    return {"edits": [{"type": kind, **fields}]}


def bad_param(raw: object) -> str | None:
    with pytest.raises(InvalidRequest) as caught:
        read_edits(raw)
    return caught.value.param


def test_edits_are_read_as_the_api_reads_them() -> None:
    assert bad_param({"edits": [{"type": "clear_everything"}]}) == "context_management.edits.0.type"
    twice = {"edits": [{"type": "clear_thinking_20251015"}] * 2}
    assert bad_param(twice) == "context_management.edits.1"
    # The compaction trigger has the API's floor of 50,000 input tokens.
    low = edit("compact_20260112", trigger={"type": "input_tokens", "value": 49_999})
    assert bad_param(low) == "context_management.edits.0.trigger.value"
    at_floor = edit("compact_20260112", trigger={"type": "input_tokens", "value": 50_000})
    assert read_edits(at_floor).compact is not None
    # A keep counted in the wrong unit, or not an integer.
    wrong = edit("clear_tool_uses_20250919", keep={"type": "thinking_turns", "value": 2})
    assert bad_param(wrong) == "context_management.edits.0.keep"
    boolean = edit("clear_tool_uses_20250919", keep={"type": "tool_uses", "value": True})
    assert bad_param(boolean) == "context_management.edits.0.keep.value"
    assert bad_param("clear") == "context_management"
    # A client's list of names is bounded.
    many = edit("clear_tool_uses_20250919", exclude_tools=[f"t{i}" for i in range(10_000)])
    assert bad_param(many) == "context_management.edits.0.exclude_tools"


def test_edit_defaults_and_keep_all() -> None:
    tools = read_edits(edit("clear_tool_uses_20250919")).tools
    assert tools is not None
    assert (tools.trigger, tools.keep) == (("input_tokens", 100_000), 3)
    assert read_edits(edit("clear_thinking_20251015")).thinking_keep == 1
    everything = read_edits(edit("clear_thinking_20251015", keep="all"))
    assert (everything.thinking, everything.thinking_keep) == (True, None)
    none = edit("clear_thinking_20251015", keep={"type": "thinking_turns", "value": 0})
    assert read_edits(none).thinking_keep == 0
    nothing = read_edits({"edits": []})
    assert (nothing.thinking, nothing.tools, nothing.compact) == (False, None, None)


def think(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": "sig"}


def use(n: int, name: str = "read") -> dict[str, Any]:
    return {"type": "tool_use", "id": f"tu{n}", "name": name, "input": {"path": f"f{n}"}}


def result(n: int, text: str = "contents " * 20) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": f"tu{n}", "content": text}


def user(*blocks: Any) -> Message:
    return {"role": "user", "content": list(blocks) or "go on"}


def assistant(*blocks: Any) -> Message:
    return {"role": "assistant", "content": list(blocks)}


def thinking_of(messages: list[Message]) -> list[bool]:
    return [
        any(b.get("type") == "thinking" for b in m["content"])
        for m in messages
        if m["role"] == "assistant"
    ]


# Two turns of the user's own; the second is a tool loop (two assistant messages).
TURNS: list[Message] = [
    user(),
    assistant(think("a"), {"type": "text", "text": "first"}),
    user(),
    assistant(think("b"), use(1)),
    user(result(1)),
    assistant(think("c"), {"type": "text", "text": "done"}),
]


def test_thinking_is_cleared_by_turn_and_a_tool_loop_is_one_turn() -> None:
    out, turns, tokens = clear_thinking(list(TURNS), 1)
    # The newest turn is the whole tool loop: both its messages keep their thinking.
    assert thinking_of(out) == [False, True, True]
    assert (turns, tokens > 0) == (1, True)
    assert TURNS[1]["content"][0]["type"] == "thinking"  # the client's list untouched
    out, turns, _ = clear_thinking(list(TURNS), 0)
    assert thinking_of(out) == [False, False, False]
    assert turns == 2
    assert clear_thinking(list(TURNS), None)[0] == TURNS


def test_a_message_of_thinking_alone_keeps_it() -> None:
    only = [user(), assistant(think("a")), user(), assistant({"type": "text", "text": "x"})]
    out, turns, _ = clear_thinking(list(only), 1)
    assert out == only  # an empty assistant message is not one the API takes
    assert turns == 0


def loop(count: int, name: str = "read") -> list[Message]:
    messages: list[Message] = [user()]
    for n in range(count):
        messages += [assistant(use(n, name)), user(result(n))]
    return messages


def results_of(messages: list[Message]) -> list[str]:
    blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
    return [b["content"] for b in blocks if b.get("type") == "tool_result"]


def test_older_tool_results_are_cleared_past_the_trigger() -> None:
    messages = loop(5)
    tools = read_edits(
        edit("clear_tool_uses_20250919", trigger={"type": "tool_uses", "value": 5})
    ).tools
    assert tools is not None
    done = clear_tool_uses(messages, tools, tokens=0)
    assert done is not None
    out, cleared, freed = done
    assert results_of(out)[:2] == [PLACEHOLDER] * 2
    assert PLACEHOLDER not in results_of(out)[2:]  # the newest three kept
    assert (cleared, freed > 0) == (2, True)
    assert results_of(messages)[0] != PLACEHOLDER  # the client's list untouched
    # Below the trigger nothing is cleared.
    assert clear_tool_uses(loop(4), tools, tokens=0) is None


def test_excluded_tools_inputs_and_clear_at_least() -> None:
    messages = loop(4, "bash")
    fields: dict[str, Any] = {"trigger": {"type": "input_tokens", "value": 10}}
    spared = read_edits(edit("clear_tool_uses_20250919", exclude_tools=["bash"], **fields))
    assert spared.tools is not None
    assert clear_tool_uses(messages, spared.tools, tokens=1000) is None
    inputs = read_edits(
        edit("clear_tool_uses_20250919", clear_tool_inputs=True, **{**fields, "keep": None})
    )
    assert inputs.tools is not None
    done = clear_tool_uses(messages, inputs.tools, tokens=1000)
    assert done is not None
    blocks = [b for m in done[0] if isinstance(m["content"], list) for b in m["content"]]
    assert [b["input"] for b in blocks if b.get("type") == "tool_use"] == [
        {},
        {"path": "f1"},
        {"path": "f2"},
        {"path": "f3"},
    ]
    least = {**fields, "clear_at_least": {"type": "input_tokens", "value": 100_000}}
    demanding = read_edits(edit("clear_tool_uses_20250919", **least))
    assert demanding.tools is not None
    assert clear_tool_uses(messages, demanding.tools, tokens=1000) is None


SEALER = Sealer(Settings(upstream={"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-up"}))


def handoff(summary: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": summary}]}


def test_a_compaction_block_stands_for_what_the_proxy_sent() -> None:
    sent = [handoff("SUMMARY: k=v"), assistant({"type": "text", "text": "noted"}), user()]
    block = compaction_block(sent, "tenant-a", SEALER)
    assert block["content"] == "SUMMARY: k=v"
    later = [user(), assistant({"type": "text", "text": "old"}), assistant(block), user()]
    body = str(later).replace("'", '"').encode()
    assert carries_compaction(body, later)
    read = expanded(later, ("tenant-a",), SEALER)
    # Everything before the block dropped; the block is what was sent; roles alternate.
    assert read[0] == sent[0]
    assert [m["role"] for m in read] == ["user", "assistant", "user"]
    # Sealed for one tenant, it opens for no other.
    with pytest.raises(InvalidRequest):
        expanded(later, ("tenant-b",), SEALER)


def test_foreign_forged_and_empty_blocks() -> None:
    foreign = {"type": "compaction", "content": "their summary", "encrypted_content": "opaque"}
    read = expanded([user(), assistant(foreign), user()], ("t",), SEALER)
    assert read[0]["role"] == "user"
    assert "their summary" in read[0]["content"][0]["text"]
    forged = {"type": "compaction", "content": "x", "encrypted_content": "cps1.e30.AAAA"}
    with pytest.raises(InvalidRequest):
        expanded([user(), assistant(forged), user()], ("t",), SEALER)
    empty = {"type": "compaction", "content": None}
    kept = [user(), assistant({"type": "text", "text": "a"}, empty), user()]
    assert expanded(kept, ("t",), SEALER) == [
        user(),
        assistant({"type": "text", "text": "a"}),
        user(),
    ]
    assert not carries_compaction(b'{"messages": []}', [])
