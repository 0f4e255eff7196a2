"""``create_simulator_app``: an OpenAI-compatible model you can run for free.

A chat request goes through these steps, in order (``_answer_chat``):

1. parse the JSON body and record it (``/_sim/requests``);
2. ``X-Sim-Fail``: answer the requested error status and stop;
3. check model, messages, roles and tool-call pairing, then strict role
   alternation when the model (or ``X-Sim-Strict-Alternation``) asks for it;
4. reject ``max_tokens`` above the model's output limit;
5. count prompt tokens and reject an overflow in the model's error format; the
   prefix a recent request of the same API key repeated is cached (prompt_cache.py),
   and why it read what it read goes in the request's record (``cache``);
6. build the deterministic reply (``replies.py``) and send it as JSON, after
   ``latency_ms`` (a summary: ``summary_latency_ms``) and the time ``tokens_per_s`` takes
   to write it, or as SSE with the stream delays (that time before the first byte),
   holding one of ``slots`` (when set: others queue, as on a single-slot server).

``/v1/responses`` follows the same steps with the Responses API's shapes
(responses.py), ``/v1/messages`` with Anthropic's (messages.py). Encoders load once,
here; nothing on the request path reads files.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.simulator.completion import Completion, completion_body, completion_chunks
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.errors import (
    ErrorInfo,
    SimError,
    max_tokens_error,
    openai_error,
    overflow_error,
    simulated_failure,
)
from proxy.simulator.listing import listing_body, props_body
from proxy.simulator.messages import messages_routes
from proxy.simulator.non_chat import embeddings_body, legacy_completion_body
from proxy.simulator.overrides import Overrides, errors_in_stream, read_overrides
from proxy.simulator.prompt_cache import chat_blocks
from proxy.simulator.recorder import Counter
from proxy.simulator.replies import Ask, Voice, build_reply
from proxy.simulator.responses import compact_route, responses_route
from proxy.simulator.state import Simulator
from proxy.simulator.stream import once, sse_events, with_thinking
from proxy.simulator.validate import (
    check_alternation,
    check_chat_request,
    parse_json_object,
    requested_output,
)

_COUNTER_FOR: dict[str, Counter] = {
    "structure": "rejected_structure",
    "overflow": "overflows",
    "failure": "failures",
    "output_budget": "rejected_output",
}
Handler = Callable[[Request], Awaitable[Response]]


async def _abandoned_during(request: Request, delay_ms: float) -> bool:
    """Wait ``delay_ms``; True as soon as the client disconnects, as a real server
    notices (and stops generating) when its caller goes away."""
    try:
        async with asyncio.timeout(delay_ms / 1000):
            while (await request.receive())["type"] != "http.disconnect":
                pass
    except TimeoutError:
        return False
    return True


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _error_response(err: SimError) -> Response:
    return Response(
        err.body, status_code=err.status, media_type=err.content_type, headers=err.headers
    )


def _seed(body: dict[str, Any], summarize: bool) -> bytes:
    # Only what shapes the reply: the same conversation streamed or not, with
    # any sampling parameters, gets the same text and the same ids.
    basis = (body.get("model"), body.get("messages"), body.get("tools"), summarize)
    return hashlib.blake2b(orjson.dumps(basis), digest_size=16).digest()


async def _answer_chat(sim: Simulator, request: Request) -> Response:
    raw = await request.body()
    body = parse_json_object(raw)
    request.state.streamed = body.get("stream") is True
    number = sim.recorder.record(request.headers, raw)
    overrides = read_overrides(request.headers)
    if overrides.fail is not None:
        raise simulated_failure(overrides.fail, str(body.get("model", "")))
    messages = check_chat_request(body)
    profile = overrides.apply(sim.profile(body["model"]))
    if profile.strict_alternation:
        check_alternation(messages)
    asked = requested_output(body)
    if asked is not None and asked[1] > profile.max_output_tokens:
        raise max_tokens_error(
            profile.error_format, asked[0], asked[1], profile.max_output_tokens, profile.name
        )
    counter = sim.counter(profile)
    prompt = counter.prompt(body, profile.tool_format)
    if profile.token_scale != 1.0:
        prompt = replace(prompt, total=int(prompt.total * profile.token_scale))
    window = profile.context_window
    # llama.cpp only rejects prompts that do not fit; generation then stops at
    # the end of the context. Everyone else reserves the requested completion.
    reserved = None if profile.error_format == "llamacpp" or asked is None else asked[1]
    if prompt.total + (reserved or 0) > window:
        raise overflow_error(
            profile.error_format,
            window=window,
            prompt=prompt.total,
            tools=prompt.tools,
            requested=reserved,
        )
    budget = min(asked[1] if asked else profile.max_output_tokens, window - prompt.total)
    if overrides.header_delay_ms and await _abandoned_during(request, overrides.header_delay_ms):
        sim.recorder.bump("calls_abandoned")
        return Response(status_code=499)
    summarize = request.headers.get("x-compaction-purpose", "").lower() == "summarize"
    seed = _seed(body, summarize)
    reply = build_reply(
        {**body, "tool_choice": None} if overrides.ignore_tool_choice else body,
        messages,
        Ask(seed, max(budget, 0), summarize),
        Voice(
            counter.encoder, sim.config.reply_tokens, profile.summary_style, profile.summary_forgets
        ),
    )
    if summarize:
        sim.recorder.bump("summaries")
    blocks = chat_blocks(
        counter, messages, prompt.tools, body.get("tools") or body.get("functions")
    )
    cached, outcome = sim.cached(request, blocks, prompt.total, profile.token_scale)
    completion = Completion(
        f"chatcmpl-{seed.hex()[:24]}", profile.name, reply, prompt.total, cached
    )
    sim.recorder.answered(number, completion.usage(), outcome)
    writing = _writing_ms(sim.config, reply.completion_tokens)
    reading = partial(sim.read_prompt_ms, blocks, prompt.total)  # once in its slot
    if body.get("stream") is True:
        return _stream(sim, overrides, body, completion, (writing, reading))
    latency = sim.config.latency_ms
    if summarize and sim.config.summary_latency_ms is not None:
        latency = sim.config.summary_latency_ms
    if overrides.latency_ms is not None:
        latency = overrides.latency_ms
    latency += writing
    async with sim.slot():
        latency += reading()
        if latency > 0 and await _abandoned_during(request, latency):
            sim.recorder.bump("calls_abandoned")
            return Response(status_code=499)  # nobody reads it: the client has gone
    return _json(completion_body(completion))


def _writing_ms(config: SimulatorConfig, tokens: int) -> float:
    """How long writing ``tokens`` output tokens takes at ``config.tokens_per_s``."""
    return 0.0 if config.tokens_per_s is None else tokens / config.tokens_per_s * 1000


def _stream(
    sim: Simulator,
    overrides: Overrides,
    body: dict[str, Any],
    completion: Completion,
    timing: tuple[float, Callable[[], float]],
) -> Response:
    """The completion as SSE, in a slot: its prompt read (``timing``'s reader, once in the
    slot), then its first byte after the stream's delay and the writing time."""
    writing_ms, reading = timing
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    settings = sim.config.stream
    chunks = completion_chunks(
        completion, chunk_chars=settings.chunk_chars, include_usage=include_usage
    )
    first = overrides.first_byte_delay_ms
    first_ms = (settings.first_byte_delay_ms if first is None else first) + writing_ms
    delay = overrides.chunk_delay_ms
    events = sse_events(
        chunks,
        first_byte_delay_s=first_ms / 1000,
        delay_s=(settings.delay_ms if delay is None else delay) / 1000,
        on_abandoned=lambda: sim.recorder.bump("streams_abandoned"),
    )
    abandoned = partial(sim.recorder.bump, "streams_abandoned")
    return StreamingResponse(
        _in_slot(sim, with_thinking(events, overrides, abandoned), reading),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def _in_slot(
    sim: Simulator, events: AsyncIterator[bytes], reading: Callable[[], float]
) -> AsyncIterator[bytes]:
    """``events``, sent while holding a slot (``Simulator.slot``), once the slot has read
    the prompt (``reading``: how long that takes)."""
    try:
        async with sim.slot():
            read_ms = reading()
            if read_ms > 0:
                await asyncio.sleep(read_ms / 1000)
            async for event in events:
                yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


def _chat_route(sim: Simulator) -> Handler:
    async def chat_completions(request: Request) -> Response:
        sim.recorder.bump("requests")
        try:
            return await _answer_chat(sim, request)
        except SimError as err:
            if err.kind in _COUNTER_FOR:
                sim.recorder.bump(_COUNTER_FOR[err.kind])
            if err.kind == "overflow" and _errors_in_stream(request):
                return _error_event_stream(err, read_overrides(request.headers))
            return _error_response(err)

    return chat_completions


def _errors_in_stream(request: Request) -> bool:
    # Only for streamed requests (known once the body parsed, before any overflow).
    return errors_in_stream(request.headers) and getattr(request.state, "streamed", False)


def _error_event_stream(err: SimError, overrides: Overrides) -> Response:
    """The error as a 200 event stream's first event, then the end of the stream."""
    body = b"data: " + err.body + b"\n\ndata: [DONE]\n\n"
    if overrides.thinking_ms:  # comments first, as a thinking model's server sends them
        return StreamingResponse(
            with_thinking(once(body), overrides), media_type="text/event-stream"
        )
    return Response(body, media_type="text/event-stream")


def _fail_first(request: Request, body: dict[str, Any]) -> None:
    fail = read_overrides(request.headers).fail
    if fail is not None:
        raise simulated_failure(fail, str(body.get("model", "")))


def _non_chat_routes(sim: Simulator) -> list[Route]:
    async def models(request: Request) -> Response:
        return _json(listing_body(sim.config))

    async def props(request: Request) -> Response:
        body = props_body(sim.config)
        return _json({"error": "Not found"}, 404) if body is None else _json(body)

    async def embeddings(request: Request) -> Response:
        try:
            body = parse_json_object(await request.body())
            _fail_first(request, body)
            counter = sim.counter(sim.profile(str(body.get("model", ""))))
            return _json(embeddings_body(body, counter))
        except SimError as err:
            return _error_response(err)

    async def completions(request: Request) -> Response:
        try:
            body = parse_json_object(await request.body())
            _fail_first(request, body)
            counter = sim.counter(sim.profile(str(body.get("model", ""))))
            return _json(legacy_completion_body(body, counter, sim.config.reply_tokens))
        except SimError as err:
            return _error_response(err)

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/props", props, methods=["GET"]),  # llama.cpp's, at its root (listing.py)
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]


def _observability_routes(sim: Simulator) -> list[Route]:
    async def list_requests(request: Request) -> Response:
        return Response(sim.recorder.requests_json(), media_type="application/json")

    async def clear_requests(request: Request) -> Response:
        sim.recorder.clear()
        sim.prompt_cache.clear()  # each test starts cold
        sim.anthropic_cache.clear()
        return Response(status_code=204)

    async def stats(request: Request) -> Response:
        return _json(sim.recorder.stats())

    return [
        Route("/_sim/requests", list_requests, methods=["GET"]),
        Route("/_sim/requests", clear_requests, methods=["DELETE"]),
        Route("/_sim/stats", stats, methods=["GET"]),
    ]


async def _unknown_route(request: Request, exc: Exception) -> Response:
    # api.openai.com's answer for a path or method it does not serve.
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    err = openai_error(status, ErrorInfo(f"Invalid URL ({request.method} {request.url.path})"))
    return _error_response(err)


def create_simulator_app(config: SimulatorConfig) -> Starlette:
    """The simulator as a Starlette app; loads tokenizers now, not per request."""
    sim = Simulator(config)
    routes = [
        Route("/v1/chat/completions", _chat_route(sim), methods=["POST"]),
        Route("/v1/responses", responses_route(sim), methods=["POST"]),
        Route("/v1/responses/compact", compact_route(sim), methods=["POST"]),
        *(Route(path, handler, methods=["POST"]) for path, handler in messages_routes(sim)),
        *_non_chat_routes(sim),
        *_observability_routes(sim),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _unknown_route, 405: _unknown_route})
    app.state.simulator = sim
    return app
