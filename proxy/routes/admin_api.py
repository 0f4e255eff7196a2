"""``GET /admin/sessions``: what the store holds, for operators; ``GET /admin/tenants``:
each tenant's net-savings ledger, as this process counted it (observe/ledger.py), and
the ``tenants:`` entry it falls under (``policy``: its label or id), if any.

Enabled only when ``server.admin_key`` is set, and answered only to
``Authorization: Bearer <admin_key>``. It lists metadata (hashed ids, sizes,
versions, times), never a summary: summaries are the tenants' data, readable
only through ``/sessions/{id}`` with the tenant's own key.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import InvalidRequest, NotFound, ProxyError
from proxy.services import Services

_MAX_LIMIT = 1000


class AdminUnauthorized(ProxyError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_admin_key"


def _authorize(request: Request, services: Services) -> None:
    admin_key = services.settings.server.admin_key.get_secret_value()
    if not admin_key:
        raise NotFound("Not found.")
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), admin_key.encode()):
        raise AdminUnauthorized("A valid admin key is required.")


async def list_sessions(request: Request, services: Services) -> Response:
    _authorize(request, services)
    raw_limit = request.query_params.get("limit", "100")
    # isdigit() alone accepts '²', which int() rejects.
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= _MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {_MAX_LIMIT}.", param="limit")
    limit = int(raw_limit)
    entries = await services.store.list_sessions(limit + 1)
    data = [
        {
            "id": key.session[:16],
            "tenant": key.tenant[:12],
            "source": key.source,
            "version": snap.version,
            "covered_messages": snap.covered,
            "summary_tokens": snap.summary_tokens,
            "tokens_before": snap.tokens_before,
            "tokens_after": snap.tokens_after,
            "model": snap.model,
            "updated_at": int(snap.updated_at),
        }
        for key, snap in entries[:limit]
    ]
    return JSONResponse({"object": "list", "data": data, "has_more": len(entries) > limit})


def _policy(services: Services, tenant: str) -> dict[str, str]:
    """The ``tenants:`` entry naming ``tenant`` (its label, or id), if one does."""
    policy = services.policies.policy_for(tenant)
    return {} if policy is None else {"policy": policy.name}


async def list_tenants(request: Request, services: Services) -> Response:
    """Each tenant's ledger totals (hashed id), this process's since it started: with
    several workers or replicas, one's share (the series are the sum)."""
    _authorize(request, services)
    tenants = list(services.ledger.tenants.items())[:_MAX_LIMIT]
    data = [
        {"tenant": tenant[:12], **_policy(services, tenant), **totals.as_dict()}
        for tenant, totals in tenants
    ]
    return JSONResponse({"object": "list", "data": data, "scope": "process"})
