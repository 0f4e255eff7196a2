"""``/sessions/{id}``: inspect, compact or forget a session, as its own tenant.

The caller's credential scopes every call exactly like chat requests, so
another tenant asking for the same id gets a 404, never someone else's data.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import NotFound
from proxy.services import Services
from proxy.session import SessionKey, session_from_header, tenant_from_headers


def _key(request: Request) -> SessionKey:
    tenant = tenant_from_headers(request.headers)
    return session_from_header(tenant, request.path_params["session_id"])


def _not_found(key: SessionKey) -> NotFound:
    return NotFound("No session with this id has a snapshot.", param="session_id")


async def get_session(request: Request, services: Services) -> Response:
    key = _key(request)
    snapshot = await services.store.load(key)
    if snapshot is None:
        raise _not_found(key)
    return JSONResponse(
        {
            "id": request.path_params["session_id"],
            "object": "compaction.session",
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
    )


async def delete_session(request: Request, services: Services) -> Response:
    key = _key(request)
    if not await services.store.delete(key):
        raise _not_found(key)
    return JSONResponse({"id": request.path_params["session_id"], "deleted": True})


async def compact_session(request: Request, services: Services) -> Response:
    # The proxy holds no history, so compaction happens on the session's next
    # request, which carries it.
    key = _key(request)
    if not await services.schedule.request(services.store, key):
        raise _not_found(key)  # exactly as GET answers: nothing to compact, or not yours
    return JSONResponse(
        {"id": request.path_params["session_id"], "status": "scheduled"}, status_code=202
    )
