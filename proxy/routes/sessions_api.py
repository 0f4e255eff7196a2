"""``/sessions/{id}``: inspect, compact or forget a session, as its own tenant.

The caller's credential scopes every call exactly like chat requests, so
another tenant asking for the same id gets a 404, never someone else's data.
A session the proxy has served but not compacted yet answers version 0 and no
summary, with its latest turn's figures (sightings.py); ``ledger``: its net-savings
totals as this process counted them (observe/ledger.py); ``shadow``: the newest shadow
snapshot (compaction/shadow.py: planned, or summarized with shadow_summarize; never
applied).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.compaction.shadow import ShadowStore
from proxy.core.session import SessionKey, session_from_header, session_slots
from proxy.errors import NotFound, RateLimited
from proxy.services import Services
from proxy.store import Snapshot, Snapshots


def _key(request: Request, services: Services) -> SessionKey:
    tenant = services.tenant_ids.of(request.headers)
    return session_from_header(tenant, request.path_params["session_id"])


async def _newest(
    services: Services, key: SessionKey, store: Snapshots | None = None
) -> tuple[SessionKey, Snapshot | None]:
    """The slot of ``key``'s session (session.explicit_slots) its newest snapshot is in:
    the conversation under this name that compacted last; ``key`` when it has none.
    ``store``: where to look (the shadow snapshots), if not the live ones."""
    slots = session_slots(key, services.settings.session.explicit_slots)
    stored = await (store or services.store).load_many(slots)
    found = [(s.updated_at, i) for i, s in enumerate(stored) if s is not None]
    if not found:
        return key, None
    i = max(found)[1]
    return slots[i], stored[i]


def _not_found(key: SessionKey) -> NotFound:
    return NotFound("The proxy has not seen a session with this id.", param="session_id")


async def get_session(request: Request, services: Services) -> Response:
    key = _key(request, services)
    (_, snapshot), (_, shadow), seen = await asyncio.gather(
        _newest(services, key),
        _newest(services, key, ShadowStore(services.store)),
        services.store.load_seen(key),
    )
    if snapshot is None and seen is None and shadow is None:
        raise _not_found(key)
    ledger = services.ledger.sessions.get(key.storage_key)  # this process's (ledger.py)
    body: dict[str, Any] = {"id": request.path_params["session_id"], "object": "compaction.session"}
    # Not compacted yet: version 0, no summary.
    body.update(_snapshot_fields(snapshot) if snapshot else {"version": 0, "summary": None})
    if seen is not None:  # its latest turn, as noted after the answer went out
        body.update(messages=seen.messages, tokens=seen.tokens, last_seen_at=int(seen.seen_at))
        body["model"] = body.get("model") or seen.model
    if isinstance(body.get("model"), str):  # its model's figures, and where they came from
        model = services.resolved_model(body["model"], key.tenant)
        body.update(context_window=model.context_window, window_source=model.source)
    if shadow is not None:  # shadow mode's newest (shadow.py): never applied
        body["shadow"] = {**_snapshot_fields(shadow), "summary": shadow.summary or None}
    if ledger is not None:  # does compaction pay: the session's totals, as this process saw
        body["ledger"] = {**ledger.as_dict(), "scope": "process"}
    return JSONResponse(body)


def _snapshot_fields(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "version": snapshot.version,
        "pinned_messages": snapshot.pinned,
        "covered_messages": snapshot.covered,
        "elided_before": snapshot.elide_before,
        "summary": snapshot.summary,
        "summary_tokens": snapshot.summary_tokens,
        "tokens_before": snapshot.tokens_before,
        "tokens_after": snapshot.tokens_after,
        "model": snapshot.model,
        "created_at": int(snapshot.created_at),
        "updated_at": int(snapshot.updated_at),
    }


async def delete_session(request: Request, services: Services) -> Response:
    key = _key(request, services)
    slots = session_slots(key, services.settings.session.explicit_slots)
    services.ledger.sessions.pop(key.storage_key, None)  # this process's totals go too
    services.ledger.cache.forget(key.storage_key)  # and what its next cache outcome reads
    services.ledger.regret.forget(key.storage_key)
    for k in slots:  # and its archive's index here (the store deletes the archive)
        services.recall.forget(k)
    shadow = ShadowStore(services.store)  # shadow mode's snapshots go too
    deletes = [*(services.store.delete(k) for k in slots), *(shadow.delete(k) for k in slots)]
    if not any(await asyncio.gather(*deletes)):
        raise _not_found(key)
    return JSONResponse({"id": request.path_params["session_id"], "deleted": True})


async def compact_session(request: Request, services: Services) -> Response:
    # The proxy holds no history, so compaction happens on the session's next
    # request, which carries it.
    key = _key(request, services)
    schedule = services.schedule
    wait = schedule.schedule_wait_s(key)
    if wait > 0:
        # Each scheduled compaction costs a summary: one per force_interval_s, as the header.
        return _rate_limited(wait)  # before any store call: a refusal costs nothing
    newest, _ = await _newest(services, key)  # the conversation that compacted last
    if not await schedule.request(services.store, newest):
        # Nothing to compact yet, or not yours (the same answer: no tenant learns more).
        message = "No session with this id has a snapshot yet; X-Compaction: force on its "
        raise NotFound(message + "next request compacts it now.", param="session_id")
    return JSONResponse(
        {"id": request.path_params["session_id"], "status": "scheduled"}, status_code=202
    )


def _rate_limited(wait_s: float) -> Response:
    seconds = math.ceil(wait_s)
    error = RateLimited(
        "A compaction of this session was requested less than compaction.force_interval_s "
        f"ago; try again in {seconds} s.",
        param="session_id",
    )
    headers = {"Retry-After": str(seconds)}
    return Response(error.body(), error.status, headers, media_type="application/json")
