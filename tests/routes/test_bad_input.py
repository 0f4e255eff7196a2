"""Issue 7 in-process: the caller's own message limit is the one parsing applies.

Odd but well-formed input over HTTP: tests/e2e/test_bad_input_e2e.py.
"""

from __future__ import annotations

import orjson
import pytest


def test_max_messages_is_the_callers_limit() -> None:
    from proxy.errors import InvalidRequest
    from proxy.routes.parse import parse_chat_request

    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 11}
    with pytest.raises(InvalidRequest) as raised:
        parse_chat_request(orjson.dumps(chat), max_messages=10)
    assert raised.value.param == "messages"
    chat["messages"] = chat["messages"][:10]
    assert len(parse_chat_request(orjson.dumps(chat), max_messages=10)["messages"]) == 10


def _nested(levels: int) -> bytes:
    """A chat body whose containers, ``levels`` of them in all, all nest in one another:
    the object, ``messages``, the message and the arrays of a field of its own."""
    deep = b"[" * (levels - 3) + b'"x"' + b"]" * (levels - 3)
    return b'{"model":"m","messages":[{"role":"user","content":"x","deep":' + deep + b"}]}"


def test_nesting_past_what_orjson_writes_is_refused_at_the_bound() -> None:
    """Parsing skips the write-back check when a body has too few brackets to nest past
    254 levels: at exactly 255 containers it must still run, and refuse."""
    from proxy.errors import InvalidRequest
    from proxy.routes.parse import parse_chat_request

    assert _nested(255).count(b"[") + _nested(255).count(b"{") == 255
    with pytest.raises(InvalidRequest) as raised:
        parse_chat_request(_nested(255))
    assert "nested too deeply" in str(raised.value)
    orjson.dumps(parse_chat_request(_nested(254)))  # 254 levels: written back fine


@pytest.mark.parametrize("field", ["tools", "metadata", "model_extra"])
def test_plain_messages_beside_a_deep_field_are_still_checked_for_depth(field: str) -> None:
    """Plain messages alone cannot nest past three levels; any other field that is not a
    scalar still has the whole body checked, and refused past 254 levels."""
    from proxy.errors import InvalidRequest
    from proxy.routes.parse import parse_chat_request

    deep: object = "x"
    for level in range(254):
        deep = [deep] if level % 2 else {"k": deep}
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1}
    # In the body's object: 255 levels, where orjson writes 254 at most.
    body = orjson.dumps(chat)[:-1] + f',"{field}":'.encode() + orjson.dumps(deep) + b"}"
    with pytest.raises(InvalidRequest) as raised:
        parse_chat_request(body)
    assert "nested too deeply" in str(raised.value)
    parse_chat_request(orjson.dumps({**chat, field: [[1]]}))  # a shallow one passes


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "x", "name": ["a"]}, "messages[1].name"),
        ({"role": "tool", "content": "x", "tool_call_id": 7}, "messages[1].tool_call_id"),
        ({"role": "tool", "content": "x", "tool_call_id": None}, "messages[1].tool_call_id"),
        ({"role": "assistant", "content": "x", "tool_calls": "f"}, "messages[1].tool_calls"),
        ({"role": 5, "content": "x"}, "messages[1]"),
        ({"role": "user", "content": 5}, "messages[1].content"),
        ({"role": "user", "content": [5]}, "messages[1].content"),
    ],
)
def test_a_message_with_role_and_text_content_is_checked_for_the_rest(
    message: dict[str, object], param: str
) -> None:
    """The shortcut for a message of a role string and a text content and nothing else
    lets nothing else through."""
    from proxy.errors import InvalidRequest
    from proxy.routes.parse import parse_chat_request

    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}, message]}
    with pytest.raises(InvalidRequest) as raised:
        parse_chat_request(orjson.dumps(chat))
    assert raised.value.param == param
