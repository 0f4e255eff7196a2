"""``POST /v1/messages``: the simulator's Anthropic Messages API, on the chat rules.

A request goes through the chat handler's steps with Anthropic's shapes:

1. parse the JSON body and record it (``/_sim/requests``); ``X-Sim-Fail`` answers (in
   Anthropic's error shape);
2. check it as api.anthropic.com does (anthropic_check.py): ``max_tokens`` required,
   alternation, the first message the user's, tool_use/tool_result pairing, thinking
   signatures, a thinking block opening the last assistant turn of a tool loop;
   ``system`` messages between turns only under the ``mid-conversation-system`` beta or
   the newer ``mid-conversation-tool-changes`` one (Claude Code's);
   ``context_management`` and ``output_config`` are accepted and ignored, and a
   ``compaction`` block is refused: an upstream without Anthropic's context management;
3. reject ``max_tokens`` above the model's output limit (Anthropic's words);
4. count the prompt (system, the messages as chat messages, thinking passed back, tool
   definitions) and reject an overflow in Anthropic's words: "prompt is too long: N
   tokens > M maximum", or "input length and `max_tokens` exceed context limit: P + R >
   W, ..." when the prompt fits but the output budget does not; with
   ``X-Sim-Errors-In-Stream`` a streamed request gets it as a 200 stream's ``error``
   event, after ``message_start`` and ``ping``;
5. the reply rules of replies.py (FACT/RECALL, CALL n, summaries under
   ``X-Compaction-Purpose: summarize``), with a signed thinking block first when the
   request enables ``thinking``;
6. answer as a ``message`` object or as its event stream (``message_start``, ``ping``,
   ``content_block_start``/``delta``/``stop``, ``message_delta`` with usage,
   ``message_stop``).

Prompt caching is simulated as Anthropic bills it (anthropic_cache.py): reads, writes
by tier (5 minutes, or an hour), expiry, and each request's outcome in its record.
``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.simulator.anthropic_check import (
    anthropic_error,
    chat_tools,
    chat_view,
    check_messages,
    invalid,
    sign,
    thinking_text,
)
from proxy.simulator.errors import SimError, max_tokens_error, overflow_error, simulated_failure
from proxy.simulator.overrides import errors_in_stream, read_overrides
from proxy.simulator.replies import Ask, Reply, Voice, build_reply
from proxy.simulator.stream import named_stream
from proxy.simulator.validate import parse_json_object

if TYPE_CHECKING:
    from proxy.simulator.state import Simulator

_COUNTED = {
    "structure": "rejected_structure",
    "overflow": "overflows",
    "failure": "failures",
    "output_budget": "rejected_output",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_NO_REPLY = Reply(content=None, tool_calls=(), finish_reason="stop", completion_tokens=0)


def messages_routes(sim: Simulator) -> list[tuple[str, Callable[[Request], Awaitable[Response]]]]:
    async def messages(request: Request) -> Response:
        sim.recorder.bump("requests")
        body: dict[str, Any] = {}
        try:
            raw = await request.body()
            body = _parse(raw)
            number = sim.recorder.record(request.headers, raw)
            return await _answer(sim, request, body, number)
        except SimError as err:
            if err.kind in _COUNTED:
                sim.recorder.bump(_COUNTED[err.kind])  # type: ignore[arg-type]
            if (
                err.kind == "overflow"
                and body.get("stream") is True
                and errors_in_stream(request.headers)
            ):
                return Response(_error_stream(body, err), media_type="text/event-stream")
            return _error(err)

    async def count_tokens(request: Request) -> Response:
        try:
            body = _parse(await request.body())
            body.setdefault("max_tokens", 1)
            check_messages(body, _system_turns(request))
            profile = sim.profile(str(body["model"]))
            return _json({"input_tokens": _prompt_tokens(sim, profile, body)})
        except SimError as err:
            return _error(err)

    return [("/v1/messages", messages), ("/v1/messages/count_tokens", count_tokens)]


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        return parse_json_object(raw)
    except SimError:
        raise invalid(
            "There was an issue with your request body: it is not a JSON object."
        ) from None


def _error_stream(body: dict[str, Any], err: SimError) -> bytes:
    """A stream that fails after it opened: ``message_start`` and ``ping``, then the
    ``error`` event, as Anthropic sends an error that comes up mid-stream."""
    usage = {"input_tokens": 0, "output_tokens": 0}
    head = message_object("msg_failed", str(body.get("model")), _NO_REPLY, None, usage)
    events = message_events(head, 1)[:2]
    out = b"".join(
        f"event: {e['type']}\n".encode() + b"data: " + orjson.dumps(e) + b"\n\n" for e in events
    )
    return out + b"event: error\ndata: " + err.body + b"\n\n"


# Betas that allow a system message between turns: Claude Code asked for the first, and
# from 2.1.332 sends its mid-conversation system message under the second.
_SYSTEM_TURN_BETAS = ("mid-conversation-system", "mid-conversation-tool-changes")


def _system_turns(request: Request) -> bool:
    """Whether the request asks for Anthropic's mid-conversation system messages."""
    betas = request.headers.get("anthropic-beta", "")
    return any(beta in betas for beta in _SYSTEM_TURN_BETAS)


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _error(err: SimError) -> Response:
    """``err`` in Anthropic's shape (an OpenAI-shaped body's message carried over)."""
    body = err.body
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if not (isinstance(parsed, dict) and parsed.get("type") == "error"):
        inner = parsed.get("error") if isinstance(parsed, dict) else None
        message = (
            inner.get("message") if isinstance(inner, dict) else body.decode("utf-8", "replace")
        )
        kind = _ERROR_TYPES.get(err.status, "api_error")
        body = anthropic_error(err.status, kind, str(message)).body
    return Response(
        body, status_code=err.status, media_type="application/json", headers=err.headers
    )


def _prompt_tokens(sim: Simulator, profile: Any, body: dict[str, Any]) -> int:
    messages = body["messages"]
    counter = sim.counter(profile)
    chat = {"messages": chat_view(body, messages), "tools": chat_tools(body.get("tools"))}
    prompt = counter.prompt(chat, profile.tool_format)
    total = prompt.total + counter.text(thinking_text(messages))
    return int(total * profile.token_scale)


async def _answer(sim: Simulator, request: Request, body: dict[str, Any], number: int) -> Response:
    """The answer to the request recorded as ``number``, its usage recorded with it."""
    overrides = read_overrides(request.headers)
    if overrides.fail is not None:
        raise simulated_failure(overrides.fail, str(body.get("model", "")))
    messages = check_messages(body, _system_turns(request))
    profile = overrides.apply(sim.profile(body["model"]))
    asked = int(body["max_tokens"])
    if asked > profile.max_output_tokens:
        raise max_tokens_error(
            "anthropic", "max_tokens", asked, profile.max_output_tokens, profile.name
        )
    total = _prompt_tokens(sim, profile, body)
    window = profile.context_window
    if total + asked > window:
        raise overflow_error("anthropic", window=window, prompt=total, tools=0, requested=asked)
    summarize = request.headers.get("x-compaction-purpose", "").lower() == "summarize"
    tools = chat_tools(body.get("tools"))
    chat = chat_view(body, messages, turns_only=True)
    seed = hashlib.blake2b(
        orjson.dumps((body["model"], body.get("system"), messages, body.get("tools"), summarize)),
        digest_size=16,
    ).digest()
    counter = sim.counter(profile)
    reply = build_reply(
        {
            "tools": tools,
            "tool_choice": None if overrides.ignore_tool_choice else body.get("tool_choice"),
        },
        chat,
        Ask(seed, max(min(asked, window - total), 0), summarize),
        Voice(
            counter.encoder, sim.config.reply_tokens, profile.summary_style, profile.summary_forgets
        ),
    )
    if summarize:
        sim.recorder.bump("summaries")
    thinking = body.get("thinking")
    thinks = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    thought = f"Thinking about {len(messages)} messages." if thinks else None
    usage, outcome = sim.anthropic_cache.usage(body, total)
    message = message_object(f"msg_{seed.hex()[:24]}", profile.name, reply, thought, usage)
    sim.recorder.answered(number, message["usage"], outcome)
    if body.get("stream") is True:
        return named_stream(message_events(message, sim.config.stream.chunk_chars), sim, overrides)
    return _json(message)


def message_object(
    message_id: str, model: str, reply: Reply, thought: str | None, usage: dict[str, Any]
) -> dict[str, Any]:
    """A ``message`` answer: thinking (signed) first, then text, then tool uses."""
    content: list[dict[str, Any]] = []
    if thought is not None:
        content.append({"type": "thinking", "thinking": thought, "signature": sign(thought)})
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        try:
            arguments = orjson.loads(call.arguments)
        except orjson.JSONDecodeError:
            arguments = {}
        tool_id = "toolu_" + call.id.removeprefix("call_")
        content.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": arguments})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP[reply.finish_reason],
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": reply.completion_tokens},
    }


def message_events(message: dict[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    """The event stream Anthropic sends for ``message`` (each event's ``type`` names it)."""
    usage = message["usage"]
    head = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": head}, {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        start: dict[str, Any]
        if kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p}
                for p in _pieces(block["thinking"], chunk_chars)
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [
                {"type": "text_delta", "text": p} for p in _pieces(block["text"], chunk_chars)
            ]
        else:
            start = {**block, "input": {}}
            arguments = orjson.dumps(block["input"]).decode()
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in _pieces(arguments, chunk_chars)
            ]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": usage,
        }
    )
    events.append({"type": "message_stop"})
    return events


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
