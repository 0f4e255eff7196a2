"""create_app(settings): routes, lifespan, and the one error handler."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TypedDict

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy import pipeline
from proxy.config import Settings
from proxy.core.outcome import rejected_headers
from proxy.core.tenant_ids import ANONYMOUS
from proxy.errors import InvalidRequest, MissingCredential, NotFound, Overloaded, ProxyError
from proxy.observe.metrics import CONTENT_TYPE_LATEST
from proxy.observe.record import record_of
from proxy.observe.record_requests import RecordRequests
from proxy.observe.recorder import Recorder
from proxy.routes import (
    admin_api,
    chat,
    messages,
    messages_count,
    models_list,
    passthrough,
    responses,
    sessions_api,
)
from proxy.routes.endpoints import endpoint
from proxy.routes.models_list import MAX_LISTING_BYTES as MAX_LISTING
from proxy.serve.reload import Reloader
from proxy.serve.shutdown import Drain
from proxy.services import Services, build_services
from proxy.shortcuts.starlette_routing import application
from proxy.upstream.api import Api
from proxy.upstream.discovery import ASKING

log = logging.getLogger("proxy.app")

# The APIs the proxy compacts (routes/: a module each), each served at /v1/ and its
# path upstream: a new one is one more entry.
APIS = (chat.CHAT, responses.RESPONSES, responses.RESPONSES_COMPACT, messages.MESSAGES)
# Routes whose every answer says what the upstream saw (X-Compaction-*), errors included.
_COMPACTION_ROUTES = frozenset(api.name for api in APIS)
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)

Handler = Callable[[Request, Services], Awaitable[Response]]


class State(TypedDict):
    """What the lifespan yields; Starlette copies it into each ``request.state``."""

    services: Services
    drain: Drain
    recorder: Recorder  # what RecordRequests finishes each request with


def services_of(request: Request) -> Services:
    """The app's services (``AttributeError`` before its lifespan has started)."""
    # The lifespan's state dict itself: ``request.state`` wraps it in a new object
    # whose every attribute read goes through ``__getattr__``.
    services: Services | None = request.scope.get("state", {}).get("services")
    if services is None:
        raise AttributeError("services: the app's lifespan has not started")
    return services


def _scoped(request: Request) -> Services:
    """The services, for a route that touches a caller's own data or calls the upstream:
    the caller's credential is its tenant, so without one there is nothing to scope by
    (DESIGN invariant 6)."""
    services = services_of(request)
    if services.settings.requires_client_key and not services.tenant_ids.has_credential(
        request.headers
    ):
        raise MissingCredential(_NO_KEY)
    return services


def _compacting(api: Api) -> Route:
    """``POST /v1/{api.path}``, through the pipeline, named for ``api`` in metrics and
    request lines."""

    def handle(request: Request) -> Awaitable[Response]:
        # Not a coroutine of its own: one frame less for every resumption of the request.
        # ``_scoped``'s check, with the tenant found once for it and for the pipeline.
        services = services_of(request)
        tenant = services.tenant_ids.of(request.headers)
        if tenant == ANONYMOUS and services.settings.requires_client_key:
            raise MissingCredential(_NO_KEY)
        ASKING.set(request.headers.raw)  # the credential an ask of the upstream goes with
        return pipeline.handle(request, services, api, tenant)

    return Route(f"/v1/{api.path}", endpoint(handle), methods=["POST"], name=api.name)


async def relay_other(request: Request) -> Response:
    return await passthrough.handle_passthrough(request, _scoped(request))


async def list_models(request: Request) -> Response:
    """``GET /v1/models`` (or one model): relayed, each model given its window."""
    services = _scoped(request)
    # As this caller's requests resolve them: what the upstream told its scope included.
    resolve = partial(services.resolved_model, tenant=services.tenant_ids.of(request.headers))
    rewrite = (partial(models_list.with_windows, resolve=resolve), MAX_LISTING)
    return await passthrough.handle_passthrough(request, services, rewrite=rewrite)


async def count_messages(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: relayed, with the compacted view's count."""
    services = _scoped(request)
    extra = partial(messages_count.view_headers, messages.MESSAGES, request, services)
    return await passthrough.handle_passthrough(request, services, extra)


async def get_session(request: Request) -> Response:
    return await sessions_api.get_session(request, _scoped(request))


async def delete_session(request: Request) -> Response:
    return await sessions_api.delete_session(request, _scoped(request))


async def compact_session(request: Request) -> Response:
    return await sessions_api.compact_session(request, _scoped(request))


async def list_sessions(request: Request) -> Response:
    return await admin_api.list_sessions(request, _scoped(request))


async def list_tenants(request: Request) -> Response:
    return await admin_api.list_tenants(request, _scoped(request))


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    services: Services | None = getattr(request.state, "services", None)
    if services is None:
        return JSONResponse({"ready": False, "store": "unknown"}, status_code=503)
    if request.state.drain.draining:
        # Stopping (SIGTERM): out of rotation at once, while requests in flight finish.
        return JSONResponse({"ready": False, "draining": True}, status_code=503)
    # What the store's recent calls met (a write probe's, when none was seen lately):
    # "ok", "degraded (readonly)", "unreachable (connection)"...
    health = await services.store.health()
    ready = health.ok or not services.settings.server.ready_requires_store
    body = {"ready": ready, "store": str(health)}
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    exposition = services_of(request).metrics.exposition()
    return Response(exposition, media_type=CONTENT_TYPE_LATEST)


async def proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    record_of(request).error = exc.code
    if exc.status >= 500:
        cause = type(exc.__cause__).__name__ if exc.__cause__ else "-"
        # The route, not the path: /sessions/{id} paths hold a session header's value.
        # The request's own line (same request_id) has the path where it is safe to log.
        route = getattr(request.scope.get("route"), "name", "other")
        log.warning("%s %s -> %d %s (%s)", request.method, route, exc.status, exc.code, cause)
    headers = _compaction_headers(request)
    if isinstance(exc, Overloaded):
        headers = {**(headers or {}), "retry-after": str(exc.retry_after_s)}
    route = getattr(request.scope.get("route"), "name", None)
    body = messages.error_body(exc) if route == messages.MESSAGES.name else exc.body()
    return Response(body, exc.status, headers, media_type="application/json")


def _compaction_headers(request: Request) -> dict[str, str] | None:
    """On a chat route, what the upstream saw: the view sent, when the error came after
    sending one (the upstream unreachable); else that the proxy refused the request."""
    if getattr(request.scope.get("route"), "name", None) not in _COMPACTION_ROUTES:
        return None
    rec = record_of(request)
    if rec.outcome is not None:
        return {k.decode(): v.decode() for k, v in rec.outcome.headers()}
    return rejected_headers(rec.window)


async def http_error(request: Request, exc: Exception) -> Response:
    # The router's own 404/405 (a path no route matches), in OpenAI's error shape.
    assert isinstance(exc, HTTPException)
    error: ProxyError = NotFound(f"Unknown request URL: {request.method} {request.url.path!r}.")
    if exc.status_code != 404:
        error = InvalidRequest(f"{request.method} is not allowed on this URL.")
        error.status = exc.status_code
    record_of(request).error = error.code
    return Response(error.body(), status_code=error.status, media_type="application/json")


# POSTs to these go straight to their handler (shortcuts/starlette_routing.py).
COMPACTING = [_compacting(api) for api in APIS]
# Names are the ``route`` of metrics and request lines.
ROUTES = [
    *COMPACTING,
    # A relayed path: named as the others for metrics and request lines.
    Route(
        "/v1/messages/count_tokens",
        endpoint(count_messages),
        methods=["POST"],
        name="passthrough",
    ),
    # A models listing: relayed with the windows the proxy plans with (models_list.py).
    Route("/v1/models", endpoint(list_models), methods=["GET"], name="passthrough"),
    Route("/v1/models/{model:path}", endpoint(list_models), methods=["GET"], name="passthrough"),
    Route("/v1/{path:path}", endpoint(relay_other), methods=_ALL_METHODS, name="passthrough"),
    Route("/sessions/{session_id}", endpoint(get_session), methods=["GET"], name="sessions"),
    Route("/sessions/{session_id}", endpoint(delete_session), methods=["DELETE"], name="sessions"),
    Route(
        "/sessions/{session_id}/compact",
        endpoint(compact_session),
        methods=["POST"],
        name="sessions",
    ),
    Route("/admin/sessions", endpoint(list_sessions), methods=["GET"], name="admin"),
    Route("/admin/tenants", endpoint(list_tenants), methods=["GET"], name="admin"),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]


def create_app(settings: Settings, drain: Drain | None = None) -> Starlette:
    """The proxy as an ASGI app; its services open and close with its lifespan.

    ``drain``: shared with the server that runs the app (proxy.serve.shutdown), which sets it
    when told to stop; the app then fails readiness and hands it its metrics.
    """
    drain = Drain() if drain is None else drain

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        services = await build_services(settings)
        drain.metrics = services.metrics
        # Settings from a file: its tenants policy reloaded when it changes, or on SIGHUP.
        source = settings._source
        reloader = None if source is None else Reloader(services, source)
        try:
            if reloader is not None:
                reloader.start()
            recorder = Recorder(services.metrics, settings, services.ledger)
            yield {"services": services, "drain": drain, "recorder": recorder}
        finally:
            try:
                if reloader is not None:
                    await reloader.aclose()
            finally:
                await services.aclose()

    handlers = {ProxyError: proxy_error, HTTPException: http_error}
    return application(
        fast=COMPACTING,
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers=handlers,
        middleware=[Middleware(RecordRequests)],
    )
