"""The request's path through the proxy: ``handle`` is the table of contents for every API
the proxy compacts, one named step each: ``_read`` (body, parse, contract, tenant, model),
``_turn`` (policy, item references, session name), ``_compact_or_pass`` (``compacted_view``:
count, session, snapshot, plan, summarize under the session's lock, rebuild, recall; or
shadow, or the body as sent), ``_first_attempt`` (the recall tool, the output budget clamped),
then ``forward`` (send, ``recover_overflow``, the recall tool's calls, relay, the follow-ups).
DESIGN.md numbers them; what differs between APIs is its ``Api`` subclass (upstream/api.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from time import perf_counter

from starlette.requests import Request
from starlette.responses import Response

from proxy.compaction import references as refs
from proxy.compaction.count import PARSE_INLINE_BYTES
from proxy.compaction.far_below import far_below
from proxy.compaction.inflight import read_body
from proxy.compaction.job import Job, trigger_for
from proxy.compaction.prepare import Prepared, prepare_turn
from proxy.compaction.schedule import scheduled
from proxy.compaction.shadow import shadow_outcome
from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.core.plan import plan_compaction
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.core.session import session_name
from proxy.errors import ClientDisconnected
from proxy.observe.record import current_record, record_of
from proxy.services import Services
from proxy.upstream import recover as recovery
from proxy.upstream.api import AS_SENT, Api, Attempt, Incoming, Route
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.disconnect import cancelled_on_disconnect
from proxy.upstream.output_items import OutputItems
from proxy.upstream.overflow import Overflow
from proxy.upstream.recover import RECOVERABLE, diagnose
from proxy.upstream.relay import relay, run_after
from proxy.upstream.stream_head import Held, Recovery, respond
from proxy.upstream.urls import api_url

# A view, and the work to start once its answer is out, in order.
_Viewed = tuple[Outcome, tuple[FollowUp, ...]]


async def handle(
    request: Request, services: Services, api: Api, tenant: str | None = None
) -> Response:
    """Steps 1-12 for one request of ``api`` (its ``tenant``, if its caller found it): read
    into the chat view the steps read, then compacted (or not), sent and recovered."""
    came = await _read(request, services, api, tenant)  # 1. read and parse, 2. the model
    if came.untouched:  # its API or contract says so: as it came, uncounted, no session
        return await forward(services, request, came.route(), came.bypassed(), None)
    turn = await _turn(request, services, came)
    if came.deal.answer is not None:  # a compaction the client asked for: the proxy answers it
        return await came.deal.answer(turn, (await compacted_view(services, turn, force=True))[0])
    viewed = await _compact_or_pass(services, turn, came)  # 3-8.
    route, first = await _first_attempt(services, turn, came, viewed)  # 8c-8d.
    return await forward(services, request, route, first, turn)  # 9-12.


async def _read(request: Request, services: Services, api: Api, tenant: str | None) -> Incoming:
    """Steps 1-2: the body read (within the in-flight budget) and parsed, under the API's own
    compaction contract, its tenant, its model, and where and how it goes upstream."""
    settings, record = services.settings, record_of(request)
    body = await read_body(request, settings.server.max_body_bytes, services.bodies)
    record.read_at = perf_counter()  # from here to the upstream call: the proxy's own work
    limits = (settings.server.max_messages, settings.server.max_model_bytes)
    if len(body) > PARSE_INLINE_BYTES:  # tens of ms (seconds, if hostile) of orjson
        data, chat = await asyncio.to_thread(api.parse, body, *limits)
    else:
        data, chat = api.parse(body, *limits)
    tenant = tenant or services.tenant_ids.of(request.headers)
    # What items sealed (and tenants: entries written) before a move name.
    legacy = services.tenant_ids.legacy_of(tenant, request.headers)
    tenants = (tenant,) if legacy is None else (tenant, legacy)
    deal = api.contract(body, data, chat, tenants, settings) or AS_SENT  # the common case
    if deal is not AS_SENT:  # under its API's own compaction contract
        body, data, chat = deal.body, deal.data, deal.chat
    model = services.known_model(chat["model"], tenant)  # 2.
    model = model or await services.effective_model(chat["model"], tenant)
    stream = bool(chat.get("stream"))
    record.note_request(model.name, tenant, stream=stream, window=model.context_window)
    headers, auth = services.headers.outgoing_and_auth(request.headers.raw)
    control = request.headers.get("x-compaction", "").strip().lower()
    url = api_url(settings.upstream.base_url, api.path)
    kept = OutputItems(services.items, tenant) if api.keeps_items else None
    return Incoming(
        api, body, data, chat, tenant, legacy, deal, model, headers, auth, control, url, kept
    )


async def _turn(request: Request, services: Services, came: Incoming) -> Turn:
    """The ``Turn`` the steps read: its tenant's policy, the items named read, its session."""
    policy = services.policies.policy_for(came.tenant, came.legacy)  # tenants.py
    mode = (services.settings.compaction if policy is None else policy.compaction).effective_mode
    chat, counts = came.chat, (0, 0)  # items named by reference, and those not read
    if came.control != "off" and mode != "off" and came.api.names_items:
        read = await refs.resolve_references(services.items, came.api, came.tenant, came.data, chat)
        services.metrics.references.observe(read.references, read.unresolved)
        chat, counts = read.chat, (read.references, read.unresolved)
    named = session_name(request.headers, came.data, services.settings.session)
    turn = came.turn(chat, named, counts, policy)  # its API and object with it
    record_of(request).note_turn(turn)
    return turn


async def _compact_or_pass(services: Services, turn: Turn, came: Incoming) -> _Viewed:
    """Steps 3-8 as the request's mode has them: the view (``compacted_view``), or the
    plan beside the body as sent (shadow), or the body as sent; and what to start once
    its answer is out, in order (the sighting first, for ``GET /sessions/{id}``)."""
    mode = turn.compaction(services.settings.compaction).effective_mode
    forced = came.control == "force" or came.deal.force
    if came.control == "off":
        return Outcome.bypassed(turn.body, turn.model.context_window), ()
    if mode == "off" or not turn.chat["messages"]:
        return Outcome.passthrough(turn.body, turn.model.context_window), ()
    if mode == "shadow" or came.control == "shadow":  # planned, sent as it came (shadow.py)
        may_force = services.schedule.may_force if forced else None
        viewed: _Viewed = (await shadow_outcome(services.compactor, turn, may_force), ())
    else:
        viewed = await compacted_view(services, turn, force=forced)
    outcome, later = viewed
    noted = services.sightings.note(turn, outcome)
    return outcome, later if noted is None else (noted, *later)


async def _first_attempt(
    services: Services, turn: Turn, came: Incoming, viewed: _Viewed
) -> tuple[Route, Attempt]:
    """Steps 8c-8d: the recall tool offered on the view (not on one whose answer is edited),
    the body for it, its output budget clamped to the model's; and its route, recovering an
    overflow unless told not to (nor without a message: nothing to compact harder)."""
    c, (outcome, follow_ups) = services.settings.compaction, viewed
    recover = came.control != "off" and c.recover_overflow and bool(turn.chat["messages"])
    shape = None if came.deal.carried else came.api.recall_tool
    offered = services.recall_tool.offer(shape, turn, outcome, came.data)
    tool, data, outcome = offered or (None, came.data, outcome)
    route = came.route(data, recover, tool)
    first = Attempt(route.body_for(outcome), outcome, follow_ups)
    return route, await services.ceilings.clamp(came.api, turn, first) if recover else first


async def compacted_view(
    services: Services, turn: Turn, *, force: bool = False, recover: bool = False
) -> _Viewed:
    """Steps 3-8: what the upstream sees of ``turn``'s history: the history itself, or
    pinned messages + handoff summary + verbatim tail; and what to start once its answer
    is out (a background pre-compaction). ``recover``: the upstream just rejected a larger
    view, so compact now (no rate limit) against ``turn.model``'s window."""
    passed = far_below(turn, services.settings.compaction, services.schedule, force or recover)
    if passed is not None:
        return passed, ()
    return await _compacted(services, turn, force, recover)


async def _compacted(services: Services, turn: Turn, force: bool, recover: bool) -> _Viewed:
    """``compacted_view`` once ``far_below`` has said no: the view, then 8b. recall."""
    outcome, later, p = await _view(services, turn, force, recover)
    outcome = await services.recall.excerpts(turn, p.session, p.history, outcome)
    return await services.recall_tool.searchable(turn, p.session, outcome), later  # 8c.


async def _view(
    services: Services, turn: Turn, force: bool, recover: bool
) -> tuple[Outcome, tuple[FollowUp, ...], Prepared]:
    """Steps 3-8: the view, its follow-ups, and the turn as prepared (counted, located)."""
    p = await prepare_turn(
        turn, services.counters, services.store, services.settings, services.metrics
    )
    c, history, budget, key, loaded = p.c, p.history, p.budget, p.key, p.loaded
    current_record().counted(key, history)
    forced = force and services.schedule.may_force(key)
    # What asks for a compaction now, whatever the threshold says; None: nothing does.
    asked = trigger_for(recover=recover, scheduled=scheduled(loaded.stored), forced=forced)
    if c.cache_aware:  # the view served last, while cached (held.py); none once asked
        loaded = services.held.choose(key, history, loaded, budget, bool(asked))
    current = loaded.view(history.pinned)  # 6. plan
    plan = plan_compaction(history, current, budget, force=bool(asked), settled=loaded.settled)
    if plan.action == "compact" or plan.nothing_to_save:
        job = Job(turn, key, history, budget, asked or "threshold")
        plan = services.compactor.settle(job, loaded, plan)  # nothing to save: back off
        if plan.action == "compact":  # 7-8. summarize under the session's lock, save, rebuild
            return await services.deadline.compact(job, loaded, plan), (), p
    if plan.fits:  # 8. rebuild
        outcome = rebuild_outcome(history, plan.view, Handoff.of(loaded, c.summary_role), budget)
        # Past the soft threshold: compact in the background once the answer is out.
        after = services.precompactor.offer(turn, p, plan.tokens)
        return outcome, (() if after is None else (after,)), p
    trims = services.compactor.trims.outcome(key, history, loaded, budget, reuse=not recover)
    return trims, (), p  # nothing worth summarizing, yet over the window: trimmed (sticky.py)


async def forward(
    services: Services, request: Request, route: Route, first: Attempt, turn: Turn | None
) -> Response:
    """Steps 9-12: send ``first``; when ``route.recover`` and the upstream rejects it as too
    long, compact ``turn`` harder and retry once; answer the recall tool's calls; relay the
    answer with its view's headers, calibrating on ``turn``'s usage, then start the follow-ups
    of the attempt it answers, in order. ``turn`` None: a request not compacted (chained)."""
    record = record_of(request)
    # The attempt whose answer goes back: the first, or a recovery's retry.
    sent = first = services.precompactor.note_sent(turn, first)  # behind a summary? busy.py
    try:
        # Until the answer's bytes flow, only this notices a client that gave up.
        with cancelled_on_disconnect(request.receive, record.read_at, services.loop) as client:
            record.sending(first.outcome)
            response = await services.client.send("POST", route.url, route.headers, first.body)
            answer: UpstreamResponse | Response = response
            status = response.status_code
            # 10. overflow: an error answer, or a stream that opens with one: retry once
            streamed = status == 200 and turn is not None and turn.chat.get("stream")
            if route.recover and turn is not None and (status in RECOVERABLE or streamed):
                client.now()  # a recovery may summarize: a client gone meanwhile stops it
                answer, sent = await recover_overflow(services, turn, route, first, response)
            if route.tool is not None:  # 10b. the recall tool's calls answered, asked again
                watch_for = partial(_usage_watcher, services, turn, route)
                answer, sent = await services.recall_tool.answer(route, sent, answer, watch_for)
            record.answered(answer.status_code, sent.outcome)
            if isinstance(answer, UpstreamResponse):
                ok = answer.status_code == 200
                # then calibrate: the provider's own count of what we sent
                watch = _usage_watcher(services, turn, route, sent.outcome) if ok else None
                headers, rewrite = refs.reference_headers(sent.outcome, turn), route.rewrite
                relayed = await relay(answer, headers, watch, rewrite=rewrite(sent.outcome))
                # then the sighting, pre-compaction, the output items kept: once it is out
                later = (*sent.follow_ups, *refs.kept_after(route)) if ok else ()
                if later:
                    run_after(relayed, later)
                return relayed
    except ClientDisconnected:
        services.metrics.client_disconnects.labels(phase="upstream").inc()
        raise
    # an error answer read, or a held stream
    answer.raw_headers.extend(refs.reference_headers(sent.outcome, turn))
    run_after(answer, refs.kept_after(route))
    return answer


async def recover_overflow(
    services: Services, turn: Turn, route: Route, first: Attempt, response: UpstreamResponse
) -> tuple[UpstreamResponse | Response, Attempt]:
    """Step 10: the response to relay and the attempt it answers (its view, follow-ups).
    When the upstream said the request is too long, compact harder (or ask for a shorter
    answer) and retry once; ``response`` is consumed unless it is a 200 stream that opens
    without an error. A stream that sends comments first starts now and recovers
    in-stream (stream_head.py)."""
    api = route.api
    answer, verdict = await diagnose(response, api.stream_failure, hold=route.tool is None)
    if isinstance(answer, Held):
        retry = partial(_second_attempt, services, turn, route, first)
        watch_for = partial(_usage_watcher, services, turn, route)
        answered = current_record().answered
        recovery = Recovery(retry, watch_for, api.stream_error, answered, api.stream_failure)
        return respond(answer, recovery, first), first
    if verdict is None:  # not ours to recover: relay the answer as the upstream wrote it
        return answer, first
    retried = await _second_attempt(services, turn, route, first, verdict)
    return retried or (answer, first)


async def _second_attempt(
    services: Services, turn: Turn, route: Route, first: Attempt, verdict: Overflow
) -> tuple[UpstreamResponse, Attempt] | None:
    """The retry after ``verdict`` and what it sent; None when nothing can change. The
    same view with a lower output budget keeps ``first``'s follow-ups; a view compacted
    again has its own (no sighting: a turn that recovered leaves the next one due)."""
    current_record().upstream_done()  # the error is read: what follows is the proxy's own time
    verdict, second = await services.ceilings.budget_retry(route.api, turn, first, verdict)
    if verdict.kind != "output_budget":  # too long: compact harder (a budget: lowered above)
        windows, models = services.windows, services.models
        window, stated = await recovery.learn_window(windows, models, turn, first, verdict)
        model = replace(turn.model, context_window=window)
        view = compacted_view(services, replace(turn, model=model), recover=True)
        retried = await recovery.retry_view(view, stated=stated)
        if retried is None:
            return None
        outcome, follow_ups = retried
        body = route.body_for(outcome)
        if len(body) >= len(first.body):  # it would only fail again
            return None
        second = Attempt(body, outcome, follow_ups)
    if second is None:
        return None
    current_record().sending(second.outcome)
    return await recovery.retry_once(services.client, services.metrics, route, verdict, second)


def _usage_watcher(
    services: Services, turn: Turn | None, route: Route, outcome: Outcome
) -> Callable[[bytes], None] | None:
    """The provider's counts in the answer to ``outcome`` to our estimates and the request's
    ledger (upstream/calibrate.py), the answer's bytes to its output items (``route.items``)."""
    usage = services.calibration.watcher(route.api.prompt_tokens, turn, outcome)
    return refs.watching_items(route, usage)
