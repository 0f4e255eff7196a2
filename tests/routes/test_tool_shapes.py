"""The recall tool in each API's shapes (routes/tool_shapes.py), read from answers as the
simulator writes them (its wire shapes follow the providers'): every call of a JSON
answer and of a whole stream, the conversation continued, and Responses' echo of the
request's tools scrubbed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.recall_tool import TOOL_NAME, Call
from proxy.routes.tool_shapes import CHAT_TOOL, MESSAGES_TOOL, RESPONSES_TOOL
from proxy.simulator.completion import Completion, completion_body, completion_chunks
from proxy.simulator.messages import message_events, message_object
from proxy.simulator.replies import Reply, ToolCallOut
from proxy.simulator.response_events import Answer, response_events, response_object
from proxy.upstream.api import ToolShape

CALLS = (
    ToolCallOut("call_a", "read_file", '{"step": 1}'),
    ToolCallOut("call_b", TOOL_NAME, '{"query": "vault_code and the launch date"}'),
)
REPLY = Reply("Let me look.", CALLS, "tool_calls", 10)
EXPECTED = [Call(c.id, c.name, c.arguments) for c in CALLS]


def _sse(events: list[dict[str, Any]], named: bool) -> bytes:
    out = b""
    for event in events:
        head = f"event: {event['type']}\n".encode() if named else b""
        out += head + b"data: " + orjson.dumps(event) + b"\n\n"
    return out + (b"" if named else b"data: [DONE]\n\n")


def _same(calls: list[Call]) -> list[tuple[str, str, Any]]:
    return [(c.id, c.name, orjson.loads(c.arguments)) for c in calls]


def test_chat_calls_from_json_and_from_a_stream_split_in_pieces() -> None:
    completion = Completion("chatcmpl-1", "m", REPLY, 100)
    assert CHAT_TOOL.calls(completion_body(completion)) == EXPECTED
    chunks = completion_chunks(completion, chunk_chars=5, include_usage=True)
    assert CHAT_TOOL.stream_calls(_sse(chunks, named=False)) == EXPECTED


def test_responses_calls_from_json_and_from_its_completed_event() -> None:
    response = response_object(Answer("t1", "m", REPLY, 100, None), {"model": "m"})
    assert _same(RESPONSES_TOOL.calls(response)) == _same(EXPECTED)
    events = response_events(response, chunk_chars=5)
    assert _same(RESPONSES_TOOL.stream_calls(_sse(events, named=True))) == _same(EXPECTED)


def test_messages_calls_from_json_and_from_input_json_deltas() -> None:
    usage = {"input_tokens": 100, "output_tokens": 10}
    message = message_object("msg_1", "m", REPLY, None, usage)
    calls = MESSAGES_TOOL.calls(message)
    assert [c.name for c in calls] == ["read_file", TOOL_NAME]
    assert _same(calls)[1][2] == {"query": "vault_code and the launch date"}
    streamed = MESSAGES_TOOL.stream_calls(_sse(message_events(message, 5), named=True))
    assert _same(streamed) == _same(calls)


@pytest.mark.parametrize(
    ("shape", "data", "names"),
    [
        (CHAT_TOOL, {"tools": [{"type": "function", "function": {"name": "a"}}]}, ["a"]),
        (RESPONSES_TOOL, {"tools": [{"type": "function", "name": "a"}]}, ["a"]),
        (MESSAGES_TOOL, {"tools": [{"name": "a", "input_schema": {}}]}, ["a"]),
    ],
)
def test_declared_after_the_clients_own(
    shape: ToolShape, data: dict[str, Any], names: list[str]
) -> None:
    assert shape.declared(data) == names
    assert shape.declared(shape.declare(data)) == [*names, TOOL_NAME]
    assert data["tools"] == shape.declare(data)["tools"][:1]  # the client's untouched
    assert shape.declared({"tools": "not a list"}) == []


def test_continued_in_each_apis_turns() -> None:
    call = Call("c1", TOOL_NAME, '{"query": "q"}')
    chat = CHAT_TOOL.continued({"messages": [{"role": "user", "content": "hi"}]}, [call], ["r"])
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool"]
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "r"}
    responses = RESPONSES_TOOL.continued({"input": "hi"}, [call], ["r"])
    assert [i.get("type", "message") for i in responses["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    messages = MESSAGES_TOOL.continued(
        {"messages": [{"role": "user", "content": "hi"}]}, [call], ["r"]
    )
    assert [m["role"] for m in messages["messages"]] == ["user", "assistant", "user"]
    assert messages["messages"][1]["content"][0]["input"] == {"query": "q"}
    assert messages["messages"][2]["content"][0]["tool_use_id"] == "c1"


def test_responses_echo_of_the_tool_is_scrubbed_json_and_stream() -> None:
    client = {"model": "m", "tools": [{"type": "function", "name": "read_file"}]}
    sent = RESPONSES_TOOL.no_more_calls(RESPONSES_TOOL.declare(client))
    text = Reply("done", (), "stop", 1)
    response = response_object(Answer("t2", "m", text, 100, None), sent)
    raw = orjson.dumps(response)
    assert TOOL_NAME.encode() in raw
    scrubbed = orjson.loads(RESPONSES_TOOL.scrub(raw, False, client))
    assert [t["name"] for t in scrubbed["tools"]] == ["read_file"]
    assert scrubbed["tool_choice"] == "auto"
    stream = _sse(response_events(response, chunk_chars=5), named=True)
    clean = RESPONSES_TOOL.scrub(stream, True, client)
    assert TOOL_NAME.encode() not in clean
    assert clean.count(b"\n\n") == stream.count(b"\n\n")  # every event kept
    assert CHAT_TOOL.scrub(b"as it came", True, client) == b"as it came"
