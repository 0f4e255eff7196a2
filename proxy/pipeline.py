"""The request's path through the proxy, top to bottom.

``handle_chat`` is the table of contents for ``POST /v1/chat/completions``:
parse, model, ``compacted_view`` (count, session, snapshot, plan, summarize
under the session's lock, rebuild), then ``forward``: send, ``recover_overflow``,
the usage watcher that calibrates our counts and, past the soft threshold, a
background compaction once the answer is out (precompact.py). Each step is one
call into the module named for it (DESIGN.md numbers them). ``POST /v1/responses``
(responses.py) runs the same steps with its API's shapes, given as a ``Route``.
``handle_passthrough`` relays every other ``/v1/*`` call untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from functools import partial

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from proxy.compaction.compact import Job, trigger_for
from proxy.compaction.count import count_history
from proxy.compaction.precompact import run_after
from proxy.compaction.schedule import scheduled
from proxy.compaction.snapshots import load_session
from proxy.core.budget import Budget
from proxy.core.digest import tenant_seed
from proxy.core.models import ResolvedModel
from proxy.core.outcome import Outcome, Turn
from proxy.core.plan import plan_compaction
from proxy.core.rebuild import rebuild_outcome
from proxy.core.session import SessionKey, session_key, session_name, tenant_from_headers
from proxy.core.tokens import bounded_by, output_reserve
from proxy.errors import ClientDisconnected
from proxy.observe.record import record_of
from proxy.routes.parse import parse_chat_request, read_body
from proxy.routes.route import Route
from proxy.services import Services
from proxy.types import ChatMessage
from proxy.upstream import client as upstream
from proxy.upstream import recover as recovery
from proxy.upstream.calibrate import find_prompt_tokens
from proxy.upstream.disconnect import cancelled_on_disconnect
from proxy.upstream.overflow import Overflow
from proxy.upstream.recover import RECOVERABLE, Attempt, diagnose, lower_output
from proxy.upstream.relay import relay
from proxy.upstream.stream_head import Held, Recovery, respond
from proxy.upstream.urls import passthrough_url, upstream_url

# Bodies above this are parsed in a worker thread, so the loop keeps serving others.
PARSE_INLINE_BYTES = 1024 * 1024


async def handle_chat(request: Request, services: Services) -> Response:
    settings = services.settings
    record = record_of(request)  # what the request's line and metrics report, at its end
    body = await read_body(request, settings.server.max_body_bytes, services.bodies)  # 1. parse
    limits = (settings.server.max_messages, settings.server.max_model_bytes)
    if len(body) > PARSE_INLINE_BYTES:  # tens of ms (seconds, if hostile) of orjson
        chat = await asyncio.to_thread(parse_chat_request, body, *limits)
    else:
        chat = parse_chat_request(body, *limits)
    tenant = tenant_from_headers(request.headers)
    model = await effective_model(services, chat["model"], tenant)  # 2.
    headers = services.headers.outgoing(request.headers.raw, inspect=True)
    control = request.headers.get("x-compaction", "").strip().lower()
    turn = Turn(
        chat=chat,
        body=body,
        model=model,
        tenant=tenant,
        session_header=session_name(request.headers, chat, settings.session),
        auth_headers=services.headers.auth_only(headers),
        record=record,
    )
    record.note_turn(turn)

    estimate = len(body) // 4
    if control == "off":
        outcome = Outcome("bypassed", None, 0, estimate, model.context_window, counted=False)
    elif not settings.compaction.enabled:
        outcome = Outcome("passthrough", None, 0, estimate, model.context_window, counted=False)
    else:  # 3-8, in the order 5, 3, 4, 6, 7-8: session_of (3) reads what 5 counted
        outcome = await compacted_view(services, turn, force=control == "force")
        outcome = services.sightings.note(turn, outcome)  # for GET /sessions/{id}
    url = upstream_url(settings.upstream.base_url, "chat/completions", b"")
    route = Route(url, headers, partial(_outgoing_body, turn), lower_output, find_prompt_tokens)
    first = Attempt(route.body_for(outcome), outcome)
    recover = control != "off" and settings.compaction.recover_overflow
    return await forward(services, request, route, first, turn, recover=recover)  # 9-10.


async def compacted_view(
    services: Services, turn: Turn, *, force: bool = False, recover: bool = False
) -> Outcome:
    """Steps 3-8: what the upstream sees of ``turn``'s history: the history itself, or
    pinned messages + handoff summary + verbatim tail. ``recover``: the upstream just
    rejected a larger view, so compact now (no rate limit) against ``turn.model``'s window.
    """
    c = services.settings.compaction
    chat, model = turn.chat, turn.model
    window = model.context_window
    reserve = output_reserve(chat, model.max_output_tokens)
    # Far below the trigger (and the pre-compaction threshold): no store, no counting.
    soonest = (c.precompact_ratio if model.precompact else None) or c.trigger_ratio
    far_below = bounded_by(turn.body, chat["messages"], int(window * soonest) - reserve)
    hinted = services.schedule.take_hint(turn.tenant, turn.session_header)
    if far_below and not (force or recover or hinted):
        return Outcome("passthrough", None, 0, len(turn.body) // 4, window, counted=False)

    counter, seed = services.counters[model.tokenizer], tenant_seed(turn.tenant)
    templated = model.templated_tools  # 5. count (tool definitions as templates render them)
    history = await count_history(counter, chat, turn.body, c.pin_first_user, seed, templated)
    key = await session_of(turn, history.messages)  # 3.
    slots = services.settings.session.derived_slots
    key, loaded = await load_session(services.store, key, history, slots)  # 4. snapshot
    turn.record.counted(key, history)
    forced = force and services.schedule.may_force(key)
    budget = Budget.for_model(model, c, reserve, history.fixed)
    # What asks for a compaction now, whatever the threshold says; None: nothing does.
    asked = trigger_for(recover=recover, scheduled=scheduled(loaded.stored), forced=forced)
    current = loaded.view(history.pinned)
    plan = plan_compaction(  # 6. plan
        history.counts, history.results, history.pinned, current, budget, force=bool(asked)
    )
    if plan.action == "compact":  # 7-8. summarize under the session's lock, save, rebuild
        job = Job(turn, key, history, budget, asked or "threshold")
        return await services.compactor.compact(job, loaded, plan)
    if plan.fits:  # 8. rebuild
        outcome = rebuild_outcome(
            history, plan.view, loaded.summary, loaded.version, budget, c.summary_role
        )
        # Past the soft threshold: compact in the background once the answer is out.
        after = services.precompactor.offer(turn, key, history, budget, plan.tokens)
        return outcome if after is None else replace(outcome, after=after)
    # Nothing worth summarizing, yet over the window: trim what we can (sticky.py).
    return services.compactor.trims.outcome(key, history, loaded, budget, reuse=not recover)


async def session_of(turn: Turn, messages: Sequence[ChatMessage]) -> SessionKey:
    """The session ``turn`` names, else the one its history derives: a hash of the
    opening messages, which can be most of a big body, so worked out off the loop."""
    if turn.session_header is None and len(turn.body) > PARSE_INLINE_BYTES:
        return await asyncio.to_thread(session_key, turn.tenant, None, messages)
    return session_key(turn.tenant, turn.session_header, messages)


async def forward(
    services: Services,
    request: Request,
    route: Route,
    first: Attempt,
    turn: Turn | None,
    *,
    recover: bool,
) -> Response:
    """Steps 9-12: send ``first``; when ``recover`` and the upstream rejects it as too
    long, compact ``turn`` harder and retry once; relay the answer with its view's
    headers, calibrating on ``turn``'s usage, and pre-compact once the answer is out.
    ``turn`` None: a request the proxy does not compact (a chained Responses call)."""
    record = record_of(request)
    outcome = first.outcome
    try:
        # Until the answer's bytes flow, only this notices a client that gave up.
        async with cancelled_on_disconnect(request.receive):
            record.sending(outcome)
            services.precompactor.note_sent(turn)  # queued behind a background summary?
            response = await services.client.send("POST", route.url, route.headers, first.body)
            answer: upstream.UpstreamResponse | Response = response
            status = response.status_code
            # 10. overflow: an error answer, or a stream that opens with one: retry once
            streamed = status == 200 and turn is not None and turn.chat.get("stream")
            if recover and turn is not None and (status in RECOVERABLE or streamed):
                answer, outcome = await recover_overflow(services, turn, route, first, response)
            record.answered(answer.status_code, outcome)
            if isinstance(answer, upstream.UpstreamResponse):
                ok = answer.status_code == 200
                # then calibrate: the provider's own count of what we sent
                watch = _usage_watcher(services, turn, route, outcome) if ok else None
                relayed = await relay(answer, outcome.headers(), watch)
                if ok and outcome.after is not None:  # then pre-compact, once the answer is out
                    run_after(relayed, outcome.after)
                return relayed
    except ClientDisconnected:
        services.metrics.client_disconnects.labels(phase="upstream").inc()
        raise
    answer.raw_headers.extend(outcome.headers())  # an error answer read, or a held stream
    return answer


async def recover_overflow(
    services: Services,
    turn: Turn,
    route: Route,
    first: Attempt,
    response: upstream.UpstreamResponse,
) -> tuple[upstream.UpstreamResponse | Response, Outcome]:
    """Step 10: the response to relay and the view it answers. When the upstream said
    the request is too long, compact harder (or ask for a shorter answer) and retry once;
    ``response`` is consumed unless it is a 200 stream that opens without an error. A
    stream that sends comments first starts now and recovers in-stream (stream_head.py)."""
    answer, verdict = await diagnose(response)
    if isinstance(answer, Held):
        retry = partial(_second_attempt, services, turn, route, first)
        watch_for = partial(_usage_watcher, services, turn, route)
        answered = turn.record.answered
        recovery = Recovery(retry, watch_for, route.stream_error, answered)
        return respond(answer, recovery, first.outcome), first.outcome
    if verdict is None:  # not ours to recover: relay the answer as the upstream wrote it
        return answer, first.outcome
    retried = await _second_attempt(services, turn, route, first, verdict)
    return retried or (answer, first.outcome)


async def _second_attempt(
    services: Services, turn: Turn, route: Route, first: Attempt, verdict: Overflow
) -> tuple[upstream.UpstreamResponse, Outcome] | None:
    """The retry after ``verdict`` and the view it sent; None when nothing can change."""
    turn.record.upstream_done()  # the error is read: what follows is the proxy's own time
    if verdict.kind == "output_budget":
        lowered = route.lower_output(first.body, verdict)
        if lowered is None:  # nothing we can change: the retry would fail the same way
            return None
        second = Attempt(lowered, first.outcome)
    else:
        window, stated = await recovery.learn_window(services, turn, first, verdict)
        model = replace(turn.model, context_window=window)
        view = compacted_view(services, replace(turn, model=model), recover=True)
        outcome = await recovery.retry_view(view, stated=stated)
        body = route.body_for(outcome) if outcome else b""
        if outcome is None or len(body) >= len(first.body):  # it would only fail again
            return None
        second = Attempt(body, outcome)
    turn.record.sending(second.outcome)
    return await recovery.retry_once(services, verdict, second, route.headers, route.url)


def _outgoing_body(turn: Turn, outcome: Outcome) -> bytes:
    """The request for the upstream: the client's own bytes when the view is the history
    as sent, else the request with the rebuilt messages."""
    if outcome.messages is None:
        return turn.body
    return orjson.dumps({**turn.chat, "messages": outcome.messages})


async def effective_model(services: Services, name: str, tenant: str) -> ResolvedModel:
    """The model's spec with the one window every step and every response uses: the
    configured window in our token units for this tenant (calibration), or the smaller
    window learned from the upstream's overflow errors."""
    model = services.calibration.apply(services.models.resolve(name), tenant)
    return await services.windows.apply(model, tenant)


def _usage_watcher(
    services: Services, turn: Turn | None, route: Route, outcome: Outcome
) -> Callable[[bytes], None] | None:
    """Feed the provider's prompt token count back into our estimates."""
    if turn is None or not outcome.counted:
        return None
    calibration, prompt_tokens = services.calibration, route.prompt_tokens
    tenant, model = turn.tenant, turn.model.name

    def watch(chunk: bytes) -> None:
        theirs = prompt_tokens(chunk)
        if theirs is not None:
            calibration.observe(tenant, model, outcome.tokens, theirs)

    return watch


async def handle_passthrough(request: Request, services: Services) -> Response:
    settings = services.settings
    record = record_of(request)
    scope = request.scope
    url = passthrough_url(
        settings.upstream.base_url, scope["path"], scope.get("raw_path"), scope["query_string"]
    )
    headers = services.headers.outgoing(request.headers.raw)
    length = request.headers.get("content-length")
    content: bytes | AsyncIterator[bytes] | None
    declared = length is not None and length.isascii() and length.isdigit()
    try:
        if declared and int(length or 0) <= settings.server.max_body_bytes:
            services.bodies.take(scope, int(length or 0))
            content = await request.body()
        elif length is None and "transfer-encoding" not in request.headers:
            content = None  # no body: a GET must not go upstream as a chunked upload
        else:
            # Unknown or large (file uploads): stream the body through unbuffered.
            content = request.stream()
        record.sending()
        response = await services.client.send(request.method, url, headers, content)
        record.answered(response.status_code)
    except ClientDisconnect:  # gone mid-body (or cut for stalling): nobody to answer
        raise ClientDisconnected("The client closed the connection.") from None
    return await relay(response)
