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
