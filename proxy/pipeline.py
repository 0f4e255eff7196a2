"""The request's path through the proxy, top to bottom: ``handle`` is the table of contents for
every API the proxy compacts: read and parse, model, ``compacted_view`` (count, session,
snapshot, plan, summarize under the session's lock, rebuild, recall), the recall tool's offer,
the output budget clamped, then ``forward``: send, ``recover_overflow``, the recall tool's calls
answered, the usage watcher and, past the soft threshold, a background compaction once the answer
is out (precompact.py). Each step is one call into the module named for it (DESIGN.md numbers
them). What differs between APIs is an ``Api`` value (upstream/api.py) from routes/."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from time import perf_counter

from starlette.requests import Request
from starlette.responses import Response

from proxy.compaction import references as refs
from proxy.compaction.count import PARSE_INLINE_BYTES, count_history, session_of
from proxy.compaction.far_below import far_below
from proxy.compaction.inflight import read_body
from proxy.compaction.job import Job, trigger_for
from proxy.compaction.precompact import run_after
from proxy.compaction.schedule import scheduled
from proxy.compaction.shadow import shadow_outcome
from proxy.compaction.snapshots import load_session
from proxy.core.budget import Budget
from proxy.core.digest import tenant_seed
from proxy.core.history import History
from proxy.core.ledger import find_cache_writes, find_cached_tokens
from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.core.plan import plan_compaction
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.core.session import SessionKey, session_name, slot_count
from proxy.core.tokens import output_reserve
from proxy.errors import ClientDisconnected
from proxy.observe.record import current_record, record_of
from proxy.services import Services
from proxy.upstream import client as upstream
from proxy.upstream import recover as recovery
from proxy.upstream.api import AS_SENT, Api, Attempt, Route
from proxy.upstream.disconnect import cancelled_on_disconnect
from proxy.upstream.output_items import OutputItems
from proxy.upstream.overflow import Overflow
from proxy.upstream.recover import RECOVERABLE, diagnose
from proxy.upstream.relay import relay
from proxy.upstream.stream_head import Held, Recovery, respond
from proxy.upstream.urls import api_url

_Viewed = tuple[Outcome, tuple[FollowUp, ...], History, SessionKey]


async def handle(
    request: Request, services: Services, api: Api, tenant: str | None = None
) -> Response:
    """Steps 1-12 for one request of ``api`` (its ``tenant``, if its caller found it): its
    body parsed into the chat view the steps read, compacted, sent and recovered."""
    settings = services.settings
    record = record_of(request)  # what the request's line and metrics report, at its end
    body = await read_body(request, settings.server.max_body_bytes, services.bodies)  # 1. parse
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
    deal = api.contract(body, data, chat, tenants, settings)  # its own compaction contract
    if deal is not None:
        body, data, chat = deal.body, deal.data, deal.chat
    else:  # the request as it came (no Contract built: the common case)
        deal = AS_SENT
    model = services.known_model(chat["model"], tenant)  # 2.
    model = model or await services.effective_model(chat["model"], tenant)
    window = model.context_window
    record.note_request(model.name, tenant, stream=bool(chat.get("stream")), window=window)
    headers, auth = services.headers.outgoing_and_auth(request.headers.raw)
    control = request.headers.get("x-compaction", "").strip().lower()
    url = api_url(settings.upstream.base_url, api.path)
    kept = OutputItems(services.items, tenant) if api.keeps_items else None
    if deal.answer is None and (api.untouched(data, control) or deal.untouched):
        bypassed = Outcome.bypassed(body, window)
        route = Route(api, url, headers, body, data, items=kept)
        return await forward(services, request, route, Attempt(body, bypassed), None)
    policy = services.policies.policy_for(tenant, legacy)  # its `tenants:` entry (tenants.py)
    mode = (settings.compaction if policy is None else policy.compaction).effective_mode
    references = unresolved = 0  # items named by reference, read as the ones relayed
    if control != "off" and mode != "off" and api.resolved is not None:  # None: never any
        read = await refs.resolve_references(services.items, api, tenant, data, chat)
        services.references.observe(read.references, read.unresolved)
        chat, references, unresolved = read.chat, read.references, read.unresolved
    named = session_name(request.headers, data, settings.session)
    turn = Turn(chat, body, model, tenant, named, auth, references, unresolved, policy, api, data)
    record.note_turn(turn)
    if deal.answer is not None:  # a compaction the client asked for: the proxy answers it
        return await deal.answer(turn, (await compacted_view(services, turn, force=True))[0])
    follow_ups: tuple[FollowUp, ...] = ()  # to start once the answer is out, in order
    if control == "off":
        outcome = Outcome.bypassed(body, window)
    elif mode == "off" or not chat["messages"]:
        outcome = Outcome.passthrough(body, window)
    elif mode == "shadow" or control == "shadow":  # planned, sent as it came (shadow.py)
        may_force = services.schedule.may_force if control == "force" or deal.force else None
        outcome = await shadow_outcome(services.compactor, turn, may_force)
        noted = services.sightings.note(turn, outcome)
        follow_ups = () if noted is None else (noted,)
    else:  # 3-8, in the order 5, 3, 4, 6, 7-8: session_of (3) reads what 5 counted
        forced = control == "force" or deal.force
        outcome, later = await compacted_view(services, turn, force=forced)
        noted = services.sightings.note(turn, outcome)  # for GET /sessions/{id}, first
        follow_ups = later if noted is None else (noted, *later)
    # Nothing to compact harder without a message (a Responses call with an empty input).
    recover = control != "off" and settings.compaction.recover_overflow and bool(chat["messages"])
    offered = services.recall_tool.offer(api.recall_tool, turn, outcome, data)  # 8c. a tool
    tool, data, outcome = offered or (None, data, outcome)
    first = Attempt(api.body_for(body, data, outcome), outcome, follow_ups)
    first = await services.ceilings.clamp(api, turn, first) if recover else first  # 8d.
    route = Route(api, url, headers, body, data, recover, kept, tool)
    return await forward(services, request, route, first, turn)  # 9-10.


async def compacted_view(
    services: Services, turn: Turn, *, force: bool = False, recover: bool = False
) -> tuple[Outcome, tuple[FollowUp, ...]]:
    """Steps 3-8: what the upstream sees of ``turn``'s history: the history itself, or
    pinned messages + handoff summary + verbatim tail; and what to start once its answer
    is out (a background pre-compaction). ``recover``: the upstream just rejected a larger
    view, so compact now (no rate limit) against ``turn.model``'s window."""
    passed = far_below(turn, services.settings.compaction, services.schedule, force or recover)
    if passed is not None:
        return passed, ()
    return await _compacted(services, turn, force, recover)


async def _compacted(
    services: Services, turn: Turn, force: bool, recover: bool
) -> tuple[Outcome, tuple[FollowUp, ...]]:
    """``compacted_view`` once ``far_below`` has said no: the view, then 8b. recall."""
    outcome, later, history, session = await _view(services, turn, force, recover)
    outcome = await services.recall.excerpts(turn, session, history, outcome)
    return await services.recall_tool.searchable(turn, session, outcome), later  # 8c.


async def _view(services: Services, turn: Turn, force: bool, recover: bool) -> _Viewed:
    """Steps 3-8: the view, its follow-ups, the history counted, the session named (3)."""
    c, model = turn.compaction(services.settings.compaction), turn.model
    reserve = output_reserve(turn.chat, model.max_output_tokens)
    counter, seed = services.counters[model.tokenizer], tenant_seed(turn.tenant)
    history = await count_history(counter, turn, c, seed)  # 5. count
    session = await session_of(turn, history.messages)  # 3.
    slots, misses = slot_count(session, services.settings.session), services.metrics.slot_misses
    key, loaded = await load_session(  # 4. snapshot
        services.store, session, history, slots, lambda o: misses.labels(outcome=o).inc()
    )
    current_record().counted(key, history)
    forced = force and services.schedule.may_force(key)
    budget = Budget.for_model(model, c, reserve, history.fixed)
    # What asks for a compaction now, whatever the threshold says; None: nothing does.
    asked = trigger_for(recover=recover, scheduled=scheduled(loaded.stored), forced=forced)
    if c.cache_aware:  # the view served last, while cached (held.py); none once asked
        loaded = services.held.choose(key, history, loaded, budget, bool(asked))
    current = loaded.view(history.pinned)
    plan = plan_compaction(history, current, budget, force=bool(asked))  # 6. plan
    if plan.action == "compact" or plan.nothing_to_save:
        job = Job(turn, key, history, budget, asked or "threshold")
        plan = services.compactor.settle(job, loaded, plan)  # nothing to save: back off
        if plan.action == "compact":  # 7-8. summarize under the session's lock, save, rebuild
            return await services.deadline.compact(job, loaded, plan), (), history, session
    if plan.fits:  # 8. rebuild
        outcome = rebuild_outcome(history, plan.view, Handoff.of(loaded, c.summary_role), budget)
        # Past the soft threshold: compact in the background once the answer is out.
        after = services.precompactor.offer(turn, key, history, budget, plan.tokens)
        return outcome, (() if after is None else (after,)), history, session
    # Nothing worth summarizing, yet over the window: trim what we can (sticky.py).
    trims = services.compactor.trims.outcome(key, history, loaded, budget, reuse=not recover)
    return trims, (), history, session


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
            answer: upstream.UpstreamResponse | Response = response
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
            if isinstance(answer, upstream.UpstreamResponse):
                ok = answer.status_code == 200
                # then calibrate: the provider's own count of what we sent
                watch = _usage_watcher(services, turn, route, sent.outcome) if ok else None
                relayed = await relay(answer, refs.reference_headers(sent.outcome, turn), watch)
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
    services: Services,
    turn: Turn,
    route: Route,
    first: Attempt,
    response: upstream.UpstreamResponse,
) -> tuple[upstream.UpstreamResponse | Response, Attempt]:
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
) -> tuple[upstream.UpstreamResponse, Attempt] | None:
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
    """The provider's prompt and cached token counts to our estimates and the request's
    ledger (observe/ledger.py), the answer's bytes to its output items (``route.items``)."""
    calibration, prompt_tokens = services.calibration, route.api.prompt_tokens
    record, calibrate = current_record(), turn is not None and outcome.counted
    tenant, model = (turn.tenant, turn.model.name) if turn is not None else ("", "")

    def watch(chunk: bytes) -> None:
        theirs = prompt_tokens(chunk)
        if theirs is not None:
            record.used(theirs, find_cached_tokens(chunk), find_cache_writes(chunk))
            if calibrate:
                calibration.observe(tenant, model, outcome.tokens, theirs)

    return refs.watching_items(route, watch)
