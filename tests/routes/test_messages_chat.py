"""Messages <-> chat groups (routes/messages_chat.py): what the planner may cut, and what
goes back upstream for a rebuilt view."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import orjson

from proxy.core.history import result_flags
from proxy.core.plan import next_group_start
from proxy.core.rebuild import _summary_messages
from proxy.routes.messages import as_budget, chat_view, prompt_tokens
from proxy.routes.messages_chat import to_anthropic, to_chat
from proxy.types import ChatMessage
from proxy.upstream.overflow import Overflow

THINK = {"type": "thinking", "thinking": "plan", "signature": "sig=="}
USE = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}
USE2 = {"type": "tool_use", "id": "toolu_2", "name": "grep", "input": {}}
RESULTS = [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x" * 50},
    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "y"}]},
    {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
]


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": [THINK, {"type": "text", "text": "reading"}, USE, USE2]},
        {"role": "user", "content": RESULTS},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": [{"type": "text", "text": "next", "cache_control": {}}]},
    ]


def test_groups_keep_tool_use_with_its_results() -> None:
    messages = conversation()
    chat = to_chat("rules", messages)
    assert [m["role"] for m in chat] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert chat[2]["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path":"a"}',
    }
    results = result_flags(chat)
    # No cut between the assistant's tool uses and the message answering them.
    assert next_group_start(results, 3) == 5
    assert chat[4]["name"] == "grep"  # the placeholder names the tool


def test_rebuilt_messages_are_the_clients_own() -> None:
    messages = conversation()
    chat = to_chat([{"type": "text", "text": "rules"}], messages)
    out = to_anthropic(chat)
    assert out == messages
    assert all(a is b for a, b in zip(out, messages, strict=True))  # the same objects


def test_an_elided_result_changes_only_its_block() -> None:
    messages = conversation()
    chat = to_chat("rules", messages)
    elided = dict(chat[3])
    elided["content"] = "[compaction-proxy: output elided]"
    out = to_anthropic([*chat[:3], elided, *chat[4:]])  # type: ignore[list-item]
    assert out[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "[compaction-proxy: output elided]",
    }
    assert out[2]["content"][1:] == RESULTS[1:]
    assert messages[2]["content"] == RESULTS  # the client's message is not touched
    assert out[1] is messages[1]  # thinking and tool uses byte for byte
    second = dict(chat[4])
    second["content"] = "[elided]"
    out = to_anthropic([*chat[:4], second, *chat[5:]])  # type: ignore[list-item]
    assert out[2]["content"] == [RESULTS[0], {**RESULTS[1], "content": "[elided]"}, RESULTS[2]]


def test_summary_turns_keep_alternation() -> None:
    messages = conversation()
    chat = to_chat("rules", messages)
    for after in (5, 6):  # cut before the assistant's "done", or before the user's "next"
        handoff = _summary_messages("S", "system", chat[after]["role"], "user")
        out = to_anthropic([chat[0], *handoff, *chat[after:]])
        roles = [m["role"] for m in out]
        assert roles[0] == "user"
        assert all(a != b for a, b in pairwise(roles))
    # A system-role handoff goes as a user turn, merged with its neighbour.
    handoff = _summary_messages("S FACT a=1", "system", "user", "system")
    out = to_anthropic([chat[0], *handoff, *chat[6:]])
    roles = [m["role"] for m in out]
    assert roles[0] == "user"
    assert all(a != b for a, b in pairwise(roles))
    assert out[-1]["content"][-1] == messages[-1]["content"][0]  # cache_control kept


def test_prompt_tokens_count_cache_reads_and_writes() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 90}
    assert prompt_tokens(orjson.dumps({"usage": usage})) == 1000
    assert prompt_tokens(b'{"usage":{"input_tokens":12,"output_tokens":3}}') == 12
    assert prompt_tokens(b'{"usage":{"output_tokens":3}}') is None


def test_output_budget_refusal_lowers_max_tokens_when_half_the_answer_fits() -> None:
    roomy = Overflow("overflow", limit=200000, prompt_tokens=182530, completion_tokens=32000)
    assert as_budget(roomy) == Overflow(
        "output_budget", limit=17470, requested=32000, prompt_tokens=182530, completion_tokens=32000
    )
    tight = Overflow("overflow", limit=200000, prompt_tokens=190000, completion_tokens=32000)
    assert as_budget(tight) is tight
    too_long = Overflow("overflow", limit=199999, prompt_tokens=209353)
    assert as_budget(too_long) is too_long


def test_chat_view_pins_the_system_and_sizes_the_answer() -> None:
    data = {
        "model": "claude",
        "system": "rules",
        "messages": conversation(),
        "max_tokens": 100,
        "tools": [{"name": "read_file", "input_schema": {}}],
        "stream": True,
    }
    chat = chat_view(data)
    first: ChatMessage = chat["messages"][0]
    assert first == {"role": "system", "content": "rules", "_system": True}  # type: ignore[comparison-overlap]
    assert chat["max_tokens"] == 100
    assert chat["stream"] is True
    assert chat["tools"] == data["tools"]


def test_a_system_message_between_turns_rides_on_the_turn_before() -> None:
    """Claude Code's ``mid-conversation-system`` beta: never a cut's first message."""
    note = {"role": "system", "content": "Available agent types: ..."}
    messages = [conversation()[0], note, *conversation()[1:3], note, *conversation()[3:]]
    chat = to_chat("rules", messages)
    assert [m["role"] for m in chat] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert chat[1]["content"][-1] == {"type": "text", "text": "Available agent types: ..."}
    out = to_anthropic(chat)
    assert out == messages
    handoff = _summary_messages("S", "system", "assistant", "user")
    out = to_anthropic([chat[0], *handoff, *chat[5:]])
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
