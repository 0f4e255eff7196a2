"""Responses input items <-> the chat messages compaction plans over (proxy/routes/items.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.digest import message_digests
from proxy.core.history import History, count_pinned, result_flags
from proxy.core.rebuild import rebuild_messages
from proxy.core.view import View
from proxy.core.wording import HANDOFF_INTRO
from proxy.errors import InvalidRequest
from proxy.routes.items import to_items, to_messages
from proxy.routes.responses import chat_view, outgoing_body, parse_responses_request
from proxy.upstream.stream_head import error_event
from tests.support.conversations import group_starts


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def reasoning(n: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"gAAA{n}=="}


def call(n: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": "read_file",
        "arguments": '{"step": 1}',
    }


def output(n: int, text: str = "contents") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"call_{n}", "output": text}


def said(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def agent_loop() -> list[dict[str, Any]]:
    """Two turns of a reasoning agent: parallel calls, a custom tool, a shell call."""
    return [
        user("start FACT a=1"),
        reasoning(1),
        call(1),
        call(2),
        output(1),
        output(2),
        reasoning(2),
        said("done with the files"),
        user("now patch it"),
        reasoning(3),
        {"type": "custom_tool_call", "call_id": "call_3", "name": "patch", "input": "*** diff"},
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "applied"},
        {"type": "local_shell_call", "id": "ls_1", "call_id": "call_4", "action": {}},
        {"type": "local_shell_call_output", "id": "ls_1", "output": "ok"},
        reasoning(4),
        said("patched"),
        user("thanks"),
    ]


def test_items_group_like_chat_messages() -> None:
    messages = to_messages("Be brief.", agent_loop())
    roles = [m["role"] for m in messages]
    assert roles == [
        "system",  # instructions: pinned, stand for no item
        "user",
        "assistant",  # reasoning + both calls
        "tool",
        "tool",
        "assistant",  # reasoning + the answer
        "user",
        "assistant",  # reasoning + custom call
        "tool",
        "assistant",  # the shell call, its output attached
        "user",
    ]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[3]["name"] == "read_file"
    assert messages[5]["content"][-1] == {"type": "text", "text": "done with the files"}


def test_rebuilding_the_whole_view_gives_back_the_items_themselves() -> None:
    items = agent_loop()
    back = to_items(to_messages("Be brief.", items))
    assert back == items
    assert all(a is b for a, b in zip(back, items, strict=True))


def _history(messages: list[Any]) -> History:
    counts = [100] * len(messages)
    return History(
        messages,
        message_digests(messages),
        counts,
        count_pinned(messages, False),
        0,
        result_flags(messages),
    )


@pytest.mark.parametrize("pairs", [1, 3])
def test_every_legal_cut_keeps_calls_outputs_and_reasoning_together(pairs: int) -> None:
    items: list[dict[str, Any]] = []
    for turn in range(4):
        items += [user(f"turn {turn}"), reasoning(turn)]
        items += [call(turn * 10 + k) for k in range(pairs)]
        items += [output(turn * 10 + k) for k in range(pairs)]
        items += [reasoning(100 + turn), said(f"answer {turn}")]
    messages = to_messages(None, [*items, user("last")])
    history = _history(messages)
    for cut in group_starts(result_flags(messages), history.pinned + 1):
        view = View(covered=cut, summary_tokens=50, elide_before=cut)
        kept = to_items(rebuild_messages(history, view, "S", 10_000))
        called = {i["call_id"] for i in kept if i.get("type") == "function_call"}
        answered = {i["call_id"] for i in kept if i.get("type") == "function_call_output"}
        assert called == answered, f"cut at {cut} splits a call from its output"
        for i, item in enumerate(kept):
            if item.get("type") == "function_call":  # after the reasoning that made it
                before = i - 1
                while kept[before].get("type") == "function_call":
                    before -= 1
                assert kept[before].get("type") == "reasoning", f"cut at {cut}"
            if item.get("type") == "reasoning":  # followed by what it produced
                assert kept[i + 1].get("type") in ("function_call", "message")
                assert kept[i + 1].get("role", "assistant") == "assistant"


def test_the_summary_goes_in_as_input_messages_before_the_verbatim_tail() -> None:
    items = [user("FACT a=1"), reasoning(1), call(1), output(1), reasoning(2), said("ok")]
    items += [user("go on"), reasoning(3), said("fine"), user("more")]
    messages = to_messages("Be brief.", items)
    history = _history(messages)
    cut = 4  # the run that opens with reasoning(2)
    out = to_items(rebuild_messages(history, View(cut, 50, cut), "the summary", 10_000))
    handoff = out[0]
    assert set(handoff) == {"type", "role", "content"}
    assert handoff["role"] == "user"
    assert handoff["content"].startswith(HANDOFF_INTRO)
    assert "the summary" in handoff["content"]
    assert out[1:] == items[4:]
    assert all(a is b for a, b in zip(out[1:], items[4:], strict=True))


def test_an_elided_output_keeps_its_item_with_a_placeholder() -> None:
    items = [user("hi"), reasoning(1), call(1), output(1, "x" * 5000), said("ok"), user("more")]
    messages = to_messages(None, items)
    history = History(
        messages, message_digests(messages), [10, 10, 2000, 10, 10], 0, 0, result_flags(messages)
    )
    view = View(covered=0, summary_tokens=0, elide_before=4)
    out = to_items(rebuild_messages(history, view, None, 400))
    assert out[3] == {**output(1), "output": out[3]["output"]}
    assert out[3]["output"].startswith("[compaction-proxy: output of tool 'read_file' elided")
    assert [o for i, o in enumerate(out) if i != 3] == [o for i, o in enumerate(items) if i != 3]


def test_encrypted_and_unknown_parts_are_counted_but_not_shown() -> None:
    item = reasoning(1)
    messages = to_messages(None, [user("a"), item, said("b"), user("c")])
    parts = messages[1]["content"]
    assert {"type": "item", "item": item} in parts
    assert {"type": "text", "text": "b"} in parts


def test_a_string_input_and_the_request_fields_that_size_it() -> None:
    body = {
        "model": "m",
        "input": "hello",
        "instructions": "Be brief.",
        "max_output_tokens": 300,
        "tools": [{"type": "function", "name": "f"}],
        "text": {"format": {"type": "json_object"}},
        "stream": True,
    }
    chat = chat_view(body)
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    assert chat["max_tokens"] == 300
    assert chat["tools"] == body["tools"]
    assert chat["response_format"] == {"type": "json_object"}
    assert chat.get("stream") is True


def test_items_that_are_not_objects_are_the_clients_400() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_responses_request(orjson.dumps({"model": "m", "input": [user("a"), 3]}), 10)
    assert err.value.param == "input[1]"
    with pytest.raises(InvalidRequest):
        parse_responses_request(orjson.dumps({"model": "m", "input": [user("a")] * 3}), 2)


@pytest.mark.parametrize(
    ("head", "is_error"),
    [
        (
            b"event: response.created\ndata: {}\n\nevent: response.in_progress\ndata: {}\n\n"
            b'event: response.failed\ndata: {"type":"response.failed"}\n\n',
            True,
        ),
        (
            b'data: {"type":"response.created"}\n\ndata: {"type":"response.failed"}\n\n',
            True,
        ),
        (b"event: response.created\ndata: {}\n\nevent: error\ndata: {}\n\n", True),
        (
            b"event: response.created\ndata: {}\n\n"
            b'event: response.output_item.added\ndata: {"type":"x"}\n\n',
            False,
        ),
    ],
)
def test_a_responses_stream_is_judged_by_its_first_event_after_the_preamble(
    head: bytes, is_error: bool
) -> None:
    assert (error_event(head) is not None) is is_error


def test_the_view_as_sent_goes_upstream_as_the_clients_bytes() -> None:
    from proxy.core.outcome import Outcome

    body = b'{"model": "m",  "input": "hi"}'
    data = orjson.loads(body)
    assert outgoing_body(body, data, Outcome("passthrough", None, 0, 1, 10)) is body
