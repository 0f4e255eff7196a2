"""Step 1: parse the client's body, rejecting what we cannot handle.

Reading it is bounded by ``server.max_body_bytes`` before anything is buffered
past the limit (``read_body``, compaction/inflight.py); parsing is orjson. Only
the shape the proxy depends on is checked: an object with a ``model`` string of
at most ``server.max_model_bytes`` (per-process tables are keyed by it) and at
most ``server.max_messages`` messages, whose role, content, name, tool_call_id
and tool calls (function, name, arguments) have the types that counting,
digesting, summarising and rebuilding read; and nesting no deeper than orjson
writes, since a rebuilt request is written back with it. Everything else is the
upstream's business and is forwarded as is.
"""

from __future__ import annotations

from typing import Any, cast

import orjson

from proxy.config import ServerSettings
from proxy.errors import (
    InvalidRequest,
    check_length,
)
from proxy.types import ChatRequest

_DEFAULT_MAX_MESSAGES: int = ServerSettings.model_fields["max_messages"].default
DEFAULT_MAX_MODEL_BYTES: int = ServerSettings.model_fields["max_model_bytes"].default
# What orjson parses as a JSON scalar (null aside).
_SCALARS = frozenset({str, int, float, bool})


def parse_chat_request(
    body: bytes,
    max_messages: int = _DEFAULT_MAX_MESSAGES,
    max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES,
) -> ChatRequest:
    data = load_request(body, max_model_bytes)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "'messages' must be a non-empty array of message objects.", param="messages"
        )
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"'messages' has {len(messages)} messages; this proxy accepts at most {max_messages}.",
            param="messages",
        )
    plain = True  # every message {role, content} strings only: nothing nests below them
    for i, message in enumerate(messages):
        # The common message passes every check below: two keys, both these strings.
        if (
            type(message) is dict
            and len(message) == 2
            and type(message.get("content")) is str
            and type(message.get("role")) is str
        ):
            continue
        plain = False
        _check_message(i, message)
    if not (plain and _scalars_beside(data, messages)):
        check_depth(data)  # else three levels deep at most: the object, its list, a message
    return cast(ChatRequest, data)


def load_request(body: bytes, max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES) -> dict[str, Any]:
    """The body as a JSON object with a ``model`` string of at most ``max_model_bytes``,
    or the client's 400."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc.msg} "
            f"(line {exc.lineno}, column {exc.colno}).",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    check_length(data["model"], max_model_bytes, "model")
    return data


def check_depth(data: dict[str, Any]) -> None:
    """orjson reads deeper nesting than it writes (254 levels); what we may write back
    must be writable. Writing it once is the check: in C, about a seventh of the parse
    (two ``bytes.count`` of its brackets cost twice the write for an 8 KB chat body,
    ten times for 400 KB: bench/README.md)."""
    written(data)


def written(data: dict[str, Any]) -> bytes:
    """``data`` as JSON, or the client's 400 when it nests deeper than orjson writes."""
    try:
        return orjson.dumps(data)
    except TypeError:
        raise InvalidRequest(
            "The request body is nested too deeply (at most 254 levels).", code="invalid_json"
        ) from None


def _scalars_beside(data: dict[str, Any], messages: list[Any]) -> bool:
    """Whether every field of ``data`` but ``messages`` is a string, number, bool or null."""
    for value in data.values():
        if value is not messages and value is not None and type(value) not in _SCALARS:
            return False
    return True


def _check_message(i: int, message: Any) -> None:
    """Only the fields the proxy reads; their values are the upstream's to judge."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        where = f"messages[{i}]"
        raise InvalidRequest(f"{where} must be an object with a 'role' string.", param=where)
    content = message.get("content")
    if content is not None and not (
        isinstance(content, str)
        or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
    ):
        where = f"messages[{i}]"
        raise InvalidRequest(
            f"{where}.content must be a string, an array of content part objects or null.",
            param=f"{where}.content",
        )
    for key in ("name", "tool_call_id"):
        if key in message and not isinstance(message[key], str):
            raise _not_a_string(f"messages[{i}].{key}")
    calls = message.get("tool_calls")
    if calls is not None:
        _check_tool_calls(f"messages[{i}]", calls)


def _check_tool_calls(where: str, calls: Any) -> None:
    """The ``tool_calls`` of the message at ``where``: call objects, each function (when
    given) an object whose name and arguments are strings."""
    if not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise InvalidRequest(
            f"{where}.tool_calls must be an array of tool call objects.",
            param=f"{where}.tool_calls",
        )
    for j, call in enumerate(calls):
        if "function" not in call:
            continue
        function = call["function"]
        at = f"{where}.tool_calls[{j}].function"
        if not isinstance(function, dict):
            raise InvalidRequest(f"{at} must be an object.", param=at)
        for key in ("name", "arguments"):
            if key in function and not isinstance(function[key], str):
                raise _not_a_string(f"{at}.{key}")


def _not_a_string(param: str) -> InvalidRequest:
    return InvalidRequest(f"{param} must be a string.", param=param)
