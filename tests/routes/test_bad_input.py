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


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "x", "name": 5}, "messages[0].name"),
        ({"role": "tool", "content": "x", "tool_call_id": None}, "messages[0].tool_call_id"),
        ({"role": "user", "content": 5}, "messages[0].content"),
        ({"role": 5, "content": "x"}, "messages[0]"),
        ({"role": "assistant", "content": "x", "tool_calls": 5}, "messages[0].tool_calls"),
    ],
)
def test_a_message_with_more_than_role_and_content_strings_is_checked(
    message: dict[str, object], param: str
) -> None:
    """The shortcut for plain ``{role, content}`` messages lets nothing else through."""
    from proxy.errors import InvalidRequest
    from proxy.routes.parse import parse_chat_request

    body = orjson.dumps({"model": "m", "messages": [message]})
    with pytest.raises(InvalidRequest) as raised:
        parse_chat_request(body)
    assert raised.value.param == param
