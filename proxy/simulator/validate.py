"""Request checks that real servers make before generating anything.

Everything here raises ``SimError`` with the server's own wording. The tool
pairing rules are OpenAI's (the ones a compactor most easily breaks by cutting
between an assistant's ``tool_calls`` and their results); the alternation rule
is what the Jinja chat templates of many open models enforce under vLLM.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.simulator.errors import invalid_request, missing_parameter, template_error

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_LEADING = ("system", "developer")
_TOOL_ROLES = ("tool", "function")

# api.openai.com's answer to a body that is not JSON.
_NOT_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
    "sent was not valid JSON. If you have trouble figuring out how to fix this, please "
    "contact us through our help center at help.openai.com.)"
)


def _json_type(value: object) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    return "an object"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or OpenAI's 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid_request(_NOT_JSON) from None
    if not isinstance(body, dict):
        raise invalid_request(
            f"Invalid type for body: expected an object, but got {_json_type(body)} instead.",
            code="invalid_type",
        )
    return body


def check_chat_request(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Check model, messages and tool pairing; return the messages."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("you must provide a model parameter")
    if "messages" not in body:
        raise missing_parameter("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise invalid_request(
            f"Invalid type for 'messages': expected an array, but got {_json_type(messages)} "
            "instead.",
            param="messages",
            code="invalid_type",
        )
    if not messages:
        raise invalid_request(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param="messages",
            code="empty_array",
            kind="structure",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid_request(
                f"Invalid type for 'messages[{i}]': expected an object, but got "
                f"{_json_type(message)} instead.",
                param=f"messages[{i}]",
                code="invalid_type",
                kind="structure",
            )
        role = message.get("role")
        if role not in ROLES:
            raise invalid_request(
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                "'user', 'function', 'tool', and 'developer'.",
                param=f"messages[{i}].role",
                code="invalid_value",
                kind="structure",
            )
    check_tool_pairing(messages)
    return messages


def _call_ids(message: dict[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [str(c.get("id")) for c in calls if isinstance(c, dict)]


def check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Each tool message answers the nearest assistant ``tool_calls``; each call is answered.

    Texts as api.openai.com returns them (e.g. miurla/morphic#136,
    aliasrobotics/cai#111), typo "preceeding" included.
    """
    issued: list[str] = []  # ids of the assistant message the tool block answers
    pending: list[str] = []
    asked_at = -1  # index of that assistant message
    in_block = False
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            if not in_block:
                raise invalid_request(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    param=f"messages.[{i}].role",
                    kind="structure",
                )
            answer = str(message.get("tool_call_id"))
            if answer not in issued:
                raise invalid_request(
                    f"Invalid parameter: 'tool_call_id' of '{answer}' not found in "
                    "'tool_calls' of previous message.",
                    param=f"messages.[{i}].tool_call_id",
                    kind="structure",
                )
            if answer in pending:
                pending.remove(answer)
            continue
        _raise_unanswered(pending, asked_at)
        issued = _call_ids(message) if role == "assistant" else []
        pending = list(issued)
        asked_at = i
        in_block = bool(issued)
    _raise_unanswered(pending, asked_at)


def _raise_unanswered(pending: list[str], asked_at: int) -> None:
    if pending:
        raise invalid_request(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}",
            param=f"messages.[{asked_at}].role",
            kind="structure",
        )


_ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/..."


def check_alternation(messages: list[dict[str, Any]]) -> None:
    """Strict chat templates: system/developer first, then user and assistant turns in turn.

    Tool results belong to the assistant turn that called them, so
    ``assistant(tool_calls) tool tool assistant`` is one turn. The conversation
    must start with a user turn and end on a user or tool message (the model
    speaks next). The text is the Jinja ``raise_exception`` of Llama/Mistral
    templates, which vLLM relays as a 400.
    """
    start = 0
    while start < len(messages) and messages[start]["role"] in _LEADING:
        start += 1
    turn: str | None = None
    previous = ""
    for message in messages[start:]:
        role = message["role"]
        if role == "user":
            ok = turn != "user"
            turn = "user"
        elif role == "assistant":
            # A second assistant message continues the turn only after tool results.
            ok = turn == "user" or (turn == "assistant" and previous in _TOOL_ROLES)
            turn = "assistant"
        elif role in _TOOL_ROLES:
            ok = turn == "assistant"
        else:  # a system/developer message after the conversation started
            ok = False
        if not ok:
            raise template_error(_ALTERNATE)
        previous = role
    if turn is None or previous not in ("user", *_TOOL_ROLES):
        raise template_error(_ALTERNATE)


def requested_output(body: dict[str, Any]) -> tuple[str, int] | None:
    """The completion budget the client asked for: (parameter name, tokens), or None."""
    for param in ("max_completion_tokens", "max_tokens"):
        value = body.get(param)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid_request(
                f"Invalid type for '{param}': expected an integer, but got {_json_type(value)} "
                "instead.",
                param=param,
                code="invalid_type",
            )
        if value < 1:
            raise invalid_request(
                f"Invalid '{param}': integer below minimum value. Expected a value >= 1, but "
                f"got {value} instead.",
                param=param,
                code="integer_below_min_value",
            )
        return param, value
    return None
