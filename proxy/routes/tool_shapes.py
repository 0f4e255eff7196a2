"""The recall tool in each API's own shapes (``ToolShape``, upstream/api.py): chat
completions' ``tools[{type: function, function}]`` and ``tool_calls``, Responses' flat
``tools[{type: function, name}]`` and ``function_call`` items, Messages'
``tools[{name, input_schema}]`` and ``tool_use`` blocks. Side by side, so the three read
as one: declare, read the calls of an answer (JSON or a whole stream), continue.

Everything read here is the upstream's: a field of the wrong type is no call.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.recall_tool import TOOL_DESCRIPTION, TOOL_NAME, TOOL_PARAMETERS, Call
from proxy.upstream.api import ToolShape


def _tools(data: dict[str, Any]) -> list[Any]:
    tools = data.get("tools")
    return tools if isinstance(tools, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON data of each event of a whole event stream (``[DONE]`` and comments
    left out)."""
    found = (
        _json(b"\n".join(line[5:].strip() for line in b.split(b"\n") if line.startswith(b"data:")))
        for b in raw.replace(b"\r\n", b"\n").split(b"\n\n")
    )
    return [event for event in found if event is not None]


def _chat_declared(data: dict[str, Any]) -> list[str]:
    return [
        _str(t["function"].get("name"))
        for t in _tools(data)
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]


def _chat_declare(data: dict[str, Any]) -> dict[str, Any]:
    tool = {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": TOOL_PARAMETERS,
        },
    }
    return {**data, "tools": [*_tools(data), tool]}


def _chat_calls(answer: dict[str, Any]) -> list[Call]:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return []
    message = choices[0].get("message")
    raw = message.get("tool_calls") if isinstance(message, dict) else None
    return [
        Call(
            _str(c.get("id")), _str(c["function"].get("name")), _str(c["function"].get("arguments"))
        )
        for c in (raw if isinstance(raw, list) else ())
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]


def _chat_stream_calls(raw: bytes) -> list[Call]:
    """The calls of a chat stream: each index's id and name from its first delta, its
    arguments the concatenation of every delta's."""
    parts: dict[int, list[str]] = {}
    for event in _events(raw):
        choices = event.get("choices")
        if not isinstance(choices, list):
            continue
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            deltas = delta.get("tool_calls") if isinstance(delta, dict) else None
            for d in deltas if isinstance(deltas, list) else ():
                if not isinstance(d, dict) or not isinstance(d.get("index"), int):
                    continue
                call = parts.setdefault(d["index"], ["", "", ""])
                given = d.get("function")
                fn = given if isinstance(given, dict) else {}
                call[0] = call[0] or _str(d.get("id"))
                call[1] = call[1] or _str(fn.get("name"))
                call[2] += _str(fn.get("arguments"))
    return [Call(*parts[i]) for i in sorted(parts)]


def _chat_continued(data: dict[str, Any], calls: list[Call], results: list[str]) -> dict[str, Any]:
    asked = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }
    answers = [
        {"role": "tool", "tool_call_id": c.id, "content": r}
        for c, r in zip(calls, results, strict=True)
    ]
    return {**data, "messages": [*data.get("messages", []), asked, *answers]}


CHAT_TOOL = ToolShape(
    declared=_chat_declared,
    declare=_chat_declare,
    calls=_chat_calls,
    stream_calls=_chat_stream_calls,
    continued=_chat_continued,
    no_more_calls=lambda data: {**data, "tool_choice": "none"},
)


def _responses_declared(data: dict[str, Any]) -> list[str]:
    return [_str(t.get("name")) for t in _tools(data) if isinstance(t, dict)]


def _responses_declare(data: dict[str, Any]) -> dict[str, Any]:
    tool = {
        "type": "function",
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": TOOL_PARAMETERS,
    }
    return {**data, "tools": [*_tools(data), tool]}


def _output_calls(output: object) -> list[Call]:
    if not isinstance(output, list):
        return []
    return [
        Call(_str(i.get("call_id")), _str(i.get("name")), _str(i.get("arguments")))
        for i in output
        if isinstance(i, dict) and i.get("type") == "function_call"
    ]


def _responses_stream_calls(raw: bytes) -> list[Call]:
    """The calls of a Responses stream: its final ``response.completed`` (or
    ``incomplete``) event carries the whole response."""
    for event in reversed(_events(raw)):
        response = event.get("response")
        if event.get("type") in ("response.completed", "response.incomplete") and isinstance(
            response, dict
        ):
            return _output_calls(response.get("output"))
    return []


def _responses_continued(
    data: dict[str, Any], calls: list[Call], results: list[str]
) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for c, r in zip(calls, results, strict=True):
        items.append(
            {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
        )
        items.append({"type": "function_call_output", "call_id": c.id, "output": r})
    given = data.get("input")
    before = given if isinstance(given, list) else [{"role": "user", "content": _str(given)}]
    return {**data, "input": [*before, *items]}


def _as_asked(response: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """A response object echoing the client's ``tools`` and ``tool_choice``, not ours."""
    out = dict(response)
    if isinstance(out.get("tools"), list):
        out["tools"] = [
            t for t in out["tools"] if not (isinstance(t, dict) and t.get("name") == TOOL_NAME)
        ]
    if "tool_choice" in out:
        out["tool_choice"] = data.get("tool_choice", "auto")
    return out


def _responses_scrub(raw: bytes, stream: bool, data: dict[str, Any]) -> bytes:
    """The answer without the recall tool in the ``tools`` it echoes (the response
    object, or each stream event's ``response``); untouched when it echoes none."""
    if TOOL_NAME.encode() not in raw:
        return raw
    if not stream:
        parsed = _json(raw)
        return orjson.dumps(_as_asked(parsed, data)) if parsed is not None else raw
    out: list[bytes] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if TOOL_NAME.encode() not in block:
            out.append(block)
            continue
        lines = block.split(b"\n")
        kind = [line for line in lines if line.startswith(b"event:")]
        data_text = b"".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
        event = _json(data_text)
        if event is None or not isinstance(event.get("response"), dict):
            out.append(block)  # not an echo of the request: as it came
            continue
        event = {**event, "response": _as_asked(event["response"], data)}
        out.append(b"\n".join([*kind, b"data: " + orjson.dumps(event)]))
    return b"\n\n".join(out)


RESPONSES_TOOL = ToolShape(
    declared=_responses_declared,
    declare=_responses_declare,
    calls=lambda answer: _output_calls(answer.get("output")),
    stream_calls=_responses_stream_calls,
    continued=_responses_continued,
    no_more_calls=lambda data: {**data, "tool_choice": "none"},
    scrub=_responses_scrub,
)


def _messages_declare(data: dict[str, Any]) -> dict[str, Any]:
    tool = {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": TOOL_PARAMETERS}
    return {**data, "tools": [*_tools(data), tool]}


def _messages_calls(answer: dict[str, Any]) -> list[Call]:
    content = answer.get("content")
    return [
        Call(_str(b.get("id")), _str(b.get("name")), orjson.dumps(b.get("input")).decode())
        for b in (content if isinstance(content, list) else ())
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]


def _messages_stream_calls(raw: bytes) -> list[Call]:
    """The calls of a Messages stream: each ``tool_use`` block's start, its input the
    concatenation of its ``input_json_delta`` parts (its start's own when none)."""
    started: dict[int, tuple[str, str, object]] = {}
    parts: dict[int, list[str]] = {}
    for event in _events(raw):
        index = event.get("index")
        if not isinstance(index, int):
            continue
        block = event.get("content_block")
        delta = event.get("delta")
        if event.get("type") == "content_block_start" and isinstance(block, dict):
            if block.get("type") == "tool_use":
                started[index] = (
                    _str(block.get("id")),
                    _str(block.get("name")),
                    block.get("input"),
                )
                parts[index] = []
        elif index in parts and isinstance(delta, dict) and delta.get("type") == "input_json_delta":
            parts[index].append(_str(delta.get("partial_json")))
    calls = []
    for index in sorted(started):
        call_id, name, given = started[index]
        arguments = "".join(parts[index]) or orjson.dumps(given or {}).decode()
        calls.append(Call(call_id, name, arguments))
    return calls


def _messages_continued(
    data: dict[str, Any], calls: list[Call], results: list[str]
) -> dict[str, Any]:
    uses = []
    for c in calls:
        try:
            arguments = orjson.loads(c.arguments)
        except orjson.JSONDecodeError:
            arguments = {}
        uses.append({"type": "tool_use", "id": c.id, "name": c.name, "input": arguments})
    answers = [
        {"type": "tool_result", "tool_use_id": c.id, "content": r}
        for c, r in zip(calls, results, strict=True)
    ]
    turns = [{"role": "assistant", "content": uses}, {"role": "user", "content": answers}]
    return {**data, "messages": [*data.get("messages", []), *turns]}


MESSAGES_TOOL = ToolShape(
    declared=_responses_declared,  # the same flat list of named tools
    declare=_messages_declare,
    calls=_messages_calls,
    stream_calls=_messages_stream_calls,
    continued=_messages_continued,
    no_more_calls=lambda data: {**data, "tool_choice": {"type": "none"}},
)
