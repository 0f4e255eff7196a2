"""``POST /v1/responses``: the simulator's Responses API, on the chat rules.

A request goes through the chat handler's steps with Responses' shapes:

1. parse the JSON body and record it (``/_sim/requests``); ``X-Sim-Fail`` answers;
2. the conversation: a stored response's items (``previous_response_id``), then
   ``input`` (a string is one user message), each ``item_reference`` replaced by the
   stored output item it names (an unknown id: OpenAI's 404, below); checked as OpenAI
   checks items (items.py);
3. reject ``max_output_tokens`` above the model's output limit;
4. count the prompt (``instructions``, the items as chat messages, reasoning passed
   back, tool definitions), its cached prefix (prompt_cache.py: the chat rule, over
   those messages), and reject an overflow: OpenAI's Responses wording
   (``context_length_exceeded``, no limit stated) or the model's other error format;
   with ``X-Sim-Errors-In-Stream`` a streamed request gets it as ``response.failed``;
5. the reply rules of replies.py (tools given in Responses' flat shape), with a
   reasoning item first when the request sets ``reasoning``;
6. answer as a ``response`` object or as its event stream, and keep the items
   (unless ``store`` is false) for a later ``previous_response_id``, and each output
   item by its id for a later ``item_reference``.

An ``item_reference`` to an id that no stored response output is what api.openai.com
answers with a 404 ``invalid_request_error`` on ``input`` (its words below, as clients
report them: Codex, opencode, CLIProxyAPI issue 999), ``store: false`` or not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.simulator.compaction import (
    compact_threshold,
    compaction_item,
    expand,
    take_trigger,
    user_messages,
)
from proxy.simulator.completion import CREATED
from proxy.simulator.errors import (
    SimError,
    invalid_request,
    missing_parameter,
    overflow_error,
    simulated_failure,
)
from proxy.simulator.items import chat_messages, check_items, reasoning_tokens
from proxy.simulator.overrides import Overrides, errors_in_stream, read_overrides
from proxy.simulator.prompt_cache import chat_blocks
from proxy.simulator.recorder import Counter
from proxy.simulator.replies import Ask, Voice, build_reply
from proxy.simulator.response_events import (
    Answer,
    failed_events,
    response_events,
    response_object,
)
from proxy.simulator.stream import named_stream
from proxy.simulator.validate import parse_json_object

if TYPE_CHECKING:
    from proxy.simulator.state import Simulator

# api.openai.com's words for a Responses input over the window; it states no limit.
CONTEXT_EXCEEDED = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
_COUNTED: dict[str, Counter] = {
    "structure": "rejected_structure",
    "overflow": "overflows",
    "failure": "failures",
    "output_budget": "rejected_output",
}


def responses_route(sim: Simulator) -> Callable[[Request], Awaitable[Response]]:
    async def responses(request: Request) -> Response:
        sim.recorder.bump("requests")
        body: dict[str, Any] = {}
        try:
            raw = await request.body()
            body = parse_json_object(raw)
            number = sim.recorder.record(request.headers, raw)
            return await _answer(sim, request, body, number)
        except SimError as err:
            if err.kind in _COUNTED:
                sim.recorder.bump(_COUNTED[err.kind])
            if (
                err.kind == "overflow"
                and body.get("stream") is True
                and errors_in_stream(request.headers)
            ):
                events = failed_events(body, "context_length_exceeded", CONTEXT_EXCEEDED)
                return named_stream(events, sim, read_overrides(request.headers))
            return Response(err.body, err.status, headers=err.headers, media_type=err.content_type)

    return responses


def compact_route(sim: Simulator) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/responses/compact``: the conversation (``input``, after a stored
    response's items for ``previous_response_id``) as its user messages and one
    ``compaction`` item carrying the simulator's summary (compaction.py)."""

    async def compact(request: Request) -> Response:
        sim.recorder.bump("requests")
        try:
            raw = await request.body()
            body = parse_json_object(raw)
            sim.recorder.record(request.headers, raw)
            overrides = read_overrides(request.headers)
            model = _model(body, overrides)
            items = check_items(expand(_conversation(sim, body)))
            profile = overrides.apply(sim.profile(model))
            counter = sim.counter(profile)
            messages = chat_messages(body.get("instructions"), items)
            total = counter.prompt({"messages": messages}, profile.tool_format).total
            seed = hashlib.blake2b(orjson.dumps((model, items)), digest_size=16).digest()
            voice = Voice(counter.encoder, sim.config.reply_tokens, profile.summary_style)
            budget = max(profile.max_output_tokens, 1)
            summary = build_reply({}, messages, Ask(seed, budget, True), voice)
            sim.recorder.bump("compactions")
            tag = seed.hex()[:24]
            used = summary.completion_tokens
            compacted = {
                "id": f"resp_{tag}",
                "object": "response.compaction",
                "created_at": CREATED,
                "output": [*user_messages(items, tag), compaction_item(tag, summary.content or "")],
                "usage": {
                    "input_tokens": total,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": used,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": total + used,
                },
            }
            return Response(orjson.dumps(compacted), media_type="application/json")
        except SimError as err:
            if err.kind in _COUNTED:
                sim.recorder.bump(_COUNTED[err.kind])
            return Response(err.body, err.status, headers=err.headers, media_type=err.content_type)

    return compact


async def _answer(sim: Simulator, request: Request, body: dict[str, Any], number: int) -> Response:
    overrides = read_overrides(request.headers)
    model = _model(body, overrides)
    items, trigger = take_trigger(_conversation(sim, body))
    threshold = compact_threshold(body)
    items = check_items(expand(items))
    profile = overrides.apply(sim.profile(model))
    asked = _max_output(body)
    if asked is not None and asked > profile.max_output_tokens:
        raise invalid_request(
            f"Invalid 'max_output_tokens': integer above maximum value. Expected a value <= "
            f"{profile.max_output_tokens}, but got {asked} instead.",
            param="max_output_tokens",
            code="integer_above_max_value",
            kind="output_budget",
        )
    counter = sim.counter(profile)
    messages = chat_messages(body.get("instructions"), items)
    tools = body.get("tools") or []
    prompt = counter.prompt({"messages": messages, "tools": tools}, profile.tool_format)
    total = int((prompt.total + reasoning_tokens(items, counter)) * profile.token_scale)
    window = profile.context_window
    if total + (asked or 0) > window:
        if profile.error_format == "openai":
            raise SimError(400, _context_exceeded(), kind="overflow")
        raise overflow_error(
            profile.error_format, window=window, prompt=total, tools=prompt.tools, requested=asked
        )
    summarize = request.headers.get("x-compaction-purpose", "").lower() == "summarize"
    seed = hashlib.blake2b(
        orjson.dumps((model, body.get("instructions"), items, tools, summarize, trigger)),
        digest_size=16,
    ).digest()
    voice = Voice(
        counter.encoder, sim.config.reply_tokens, profile.summary_style, profile.summary_forgets
    )
    budget = max(min(asked or profile.max_output_tokens, window - total), 0)
    shown = messages or [{"role": "user", "content": ""}]
    # A compaction_trigger, or a prompt past context_management's threshold: a summary.
    compacts = trigger or (threshold is not None and total > threshold)
    summary = build_reply({}, shown, Ask(seed, budget, True), voice) if compacts else None
    reply = (
        summary
        if trigger and summary is not None
        else build_reply(
            {
                "tools": [_chat_tool(t) for t in tools if isinstance(t, dict)],
                "tool_choice": None if overrides.ignore_tool_choice else body.get("tool_choice"),
            },
            shown,
            Ask(seed, budget, summarize),
            voice,
        )
    )
    if summarize:
        sim.recorder.bump("summaries")
    thinks = isinstance(body.get("reasoning"), dict) and not trigger
    reasoning = f"Thinking about {len(items)} items." if thinks else None
    blocks = chat_blocks(counter, messages, prompt.tools, tools)
    cached, outcome = sim.cached(request, blocks, total, profile.token_scale)
    answer = Answer(seed.hex()[:24], profile.name, reply, total, reasoning, cached)
    response = response_object(answer, body)
    if summary is not None:
        sim.recorder.bump("compactions")
        item = compaction_item(answer.tag, summary.content or "")
        response["output"] = [item] if trigger else [item, *response["output"]]
    sim.recorder.answered(number, response["usage"], outcome)
    if body.get("store") is not False:
        sim.responses.put(response["id"], [*items, *response["output"]], response["output"])
    if body.get("stream") is True:
        events = response_events(response, sim.config.stream.chunk_chars)
        return named_stream(events, sim, overrides)
    return Response(orjson.dumps(response), media_type="application/json")


def _conversation(sim: Simulator, body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    items: list[Any] = [{"type": "message", "role": "user", "content": raw}]
    if isinstance(raw, list):
        items = raw
    elif not isinstance(raw, str):
        raise invalid_request(
            "Invalid type for 'input': expected a string or an array of input items.",
            param="input",
            code="invalid_type",
        )
    items = [_dereferenced(sim, item) for item in items]
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        items = [*sim.responses.get(previous), *items]
    if not items:
        raise invalid_request(
            "Invalid 'input': empty array. Expected an array with minimum length 1.",
            param="input",
            code="empty_array",
        )
    return items


def _model(body: dict[str, Any], overrides: Overrides) -> str:
    """The request's model, once an ``X-Sim-Fail`` failure (which comes first) is not
    asked for."""
    model = body.get("model")
    if overrides.fail is not None:
        raise simulated_failure(overrides.fail, str(model or ""))
    if not isinstance(model, str) or not model:
        raise missing_parameter("model")
    return model


def _dereferenced(sim: Simulator, item: Any) -> Any:
    """``item``, or the stored output item an ``item_reference`` names."""
    if isinstance(item, dict) and item.get("type") == "item_reference":
        return sim.responses.item(str(item.get("id")))
    return item


def _max_output(body: dict[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid_request(
            "Invalid 'max_output_tokens': expected a positive integer.",
            param="max_output_tokens",
            code="invalid_type",
        )
    return value


def _context_exceeded() -> bytes:
    error = {
        "message": CONTEXT_EXCEEDED,
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
    return orjson.dumps({"error": error})


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses tool (flat: type, name, parameters) as the chat rules read one."""
    if tool.get("type") == "function" and "function" not in tool:
        fn = {"name": tool.get("name"), "description": tool.get("description")}
        return {"type": "function", "function": fn}
    return tool
