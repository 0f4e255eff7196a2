"""create_app(settings): routes, lifespan, and the one error handler."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy import admin_api, pipeline, sessions_api
from proxy.calibrate import Calibration
from proxy.compact import Compactor
from proxy.config import Settings
from proxy.encodings import load_encoders
from proxy.errors import InvalidRequest, MissingCredential, NotFound, ProxyError
from proxy.metrics import CONTENT_TYPE_LATEST, Metrics
from proxy.models import ModelTable
from proxy.schedule import Schedule
from proxy.services import Services
from proxy.session import has_credential
from proxy.store import build_store
from proxy.tokens import TokenCounter
from proxy.upstream import HeaderPolicy, UpstreamClient
from proxy.windows import LearnedWindows

log = logging.getLogger("proxy.app")

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


def create_app(settings: Settings) -> Starlette:
    """The proxy as an ASGI app; shared resources open and close with its lifespan."""

    metrics = Metrics.create()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        models = ModelTable(settings)
        # Tokenizer files load in a thread: seconds of CPU and disk, never on the loop.
        encoders = await asyncio.to_thread(load_encoders, sorted(models.tokenizers()))
        client = UpstreamClient(settings)
        store = build_store(settings, metrics)
        counters = {name: TokenCounter(enc) for name, enc in encoders.items()}
        compactor = Compactor(
            settings=settings,
            store=store,
            counters=counters,
            client=client,
            models=models,
            metrics=metrics,
        )
        c = settings.compaction
        windows = LearnedWindows(
            store,
            settings.upstream.base_url,
            c.learned_window_ttl_s,
            metrics,
            quorum=c.learned_window_quorum,
            interval_s=c.learned_window_interval_s,
        )
        app.state.services = Services(
            settings=settings,
            client=client,
            headers=HeaderPolicy(settings),
            models=models,
            store=store,
            counters=counters,
            calibration=Calibration(),
            schedule=Schedule(force_interval_s=c.force_interval_s),
            compactor=compactor,
            windows=windows,
            metrics=metrics,
        )
        try:
            yield
        finally:
            await store.aclose()
            await client.aclose()

    requires_key = settings.requires_client_key

    def _bind(handler: Any) -> Any:
        """A route for a caller's own data or upstream calls: the caller's credential is
        its tenant, so without one there is nothing to scope by (DESIGN invariant 6)."""

        async def endpoint(request: Request) -> Response:
            if requires_key and not has_credential(request.headers):
                raise MissingCredential(_NO_KEY)
            return await handler(request, request.app.state.services)  # type: ignore[no-any-return]

        return endpoint

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        services = getattr(request.app.state, "services", None)
        if services is None:
            return JSONResponse({"ready": False, "store": "unknown"}, status_code=503)
        store_ok = await services.store.ping()
        ready = store_ok or not settings.server.ready_requires_store
        body = {"ready": ready, "store": "ok" if store_ok else "unreachable"}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def proxy_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProxyError)
        if exc.status >= 500:
            cause = type(exc.__cause__).__name__ if exc.__cause__ else "-"
            log.warning(
                "%s %s -> %d %s (%s)", request.method, request.url.path, exc.status, exc.code, cause
            )
        return Response(exc.body(), status_code=exc.status, media_type="application/json")

    async def http_error(request: Request, exc: Exception) -> Response:
        # The router's own 404/405 (a path no route matches), in OpenAI's error shape.
        assert isinstance(exc, HTTPException)
        error: ProxyError = NotFound(f"Unknown request URL: {request.method} {request.url.path!r}.")
        if exc.status_code != 404:
            error = InvalidRequest(f"{request.method} is not allowed on this URL.")
            error.status = exc.status_code
        return Response(error.body(), status_code=error.status, media_type="application/json")

    routes = [
        Route("/v1/chat/completions", _bind(pipeline.handle_chat), methods=["POST"]),
        Route("/v1/{path:path}", _bind(pipeline.handle_passthrough), methods=_ALL_METHODS),
        Route("/sessions/{session_id}", _bind(sessions_api.get_session), methods=["GET"]),
        Route("/sessions/{session_id}", _bind(sessions_api.delete_session), methods=["DELETE"]),
        Route(
            "/sessions/{session_id}/compact", _bind(sessions_api.compact_session), methods=["POST"]
        ),
        Route("/admin/sessions", _bind(admin_api.list_sessions), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    handlers = {ProxyError: proxy_error, HTTPException: http_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
