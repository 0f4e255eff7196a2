"""A fast route's POST (routes/dispatch.py) is served as Starlette would serve it: the same
messages out, the same exception raised, the same scope keys, without the router."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.compaction.inflight import _HELD, BodyBudget
from proxy.config import ServerSettings
from proxy.errors import InvalidRequest, ProxyError
from proxy.routes.dispatch import Dispatch
from proxy.routes.endpoints import ProxyRequest, endpoint

SEEN: list[tuple[str, Any]] = []  # what the handlers and the middleware saw
BUDGET = BodyBudget(ServerSettings())


async def _late_failure() -> AsyncIterator[bytes]:
    yield b"first"
    raise InvalidRequest("too late")


async def chat(request: Request) -> Response:
    SEEN.append(("request", type(request)))
    BUDGET.take(request.scope, 10)  # released once the request ends, however it ends
    case = request.headers.get("x-case")
    if case == "proxy-error":
        raise InvalidRequest("bad", param="messages")
    if case == "http-error":
        raise HTTPException(409, "conflict")
    if case == "crash":
        raise KeyError("boom")
    if case == "late":
        return StreamingResponse(_late_failure())
    return JSONResponse({"ok": True}, headers={"x-answer": "yes"})


async def other(request: Request) -> Response:
    return JSONResponse({"other": request.method})


async def on_proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    SEEN.append(("handled", (type(exc).__name__, request.scope["route"].name)))
    return Response(exc.body(), exc.status, media_type="application/json")


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return Response(f"http {exc.status_code}", exc.status_code)


class Noting:
    """An app's middleware: notes each message and what the route left in the scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def noted(message: Message) -> None:
            SEEN.append(("sent", message["type"]))
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            route = scope.get("route")
            keys = ("endpoint", "path_params", "starlette.exception_handlers")
            SEEN.append(("scope", (getattr(route, "name", None), *(k in scope for k in keys))))
            SEEN.append(("router", scope.get("router") is scope["app"].router))
            SEEN.append(("held", scope.get(_HELD)))


def _app(kind: type[Starlette]) -> Starlette:
    fast = Route("/v1/chat/completions", endpoint(chat), methods=["POST"], name="chat")
    routes = [fast, Route("/v1/{path:path}", endpoint(other), methods=["GET", "POST"])]
    handlers = {ProxyError: on_proxy_error, HTTPException: on_http_error}
    options: dict[str, Any] = {"routes": routes, "exception_handlers": handlers}
    options["middleware"] = [Middleware(Noting)]
    return Dispatch(fast=[fast], **options) if kind is Dispatch else kind(**options)


async def _serve(app: Starlette, method: str, path: str, case: str) -> list[Any]:
    """What one request did: the messages out, the exception raised, what was seen."""
    SEEN.clear()
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"x-case", case.encode())],
    }
    out: list[Message] = []
    inbox = [{"type": "http.disconnect"}, {"type": "http.request", "body": b"{}"}]

    async def receive() -> Message:
        if len(inbox) == 1:
            await asyncio.sleep(0.05)  # the client leaves once the answer is out
        return inbox.pop() if inbox else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        out.append(message)

    try:
        await app(scope, receive, send)
        raised = None
    except Exception as exc:
        raised = (type(exc).__name__, str(exc), type(exc.__cause__).__name__)
    return [out, raised, list(SEEN)]


CASES = ["ok", "proxy-error", "http-error", "crash", "late"]


@pytest.mark.parametrize("case", CASES)
async def test_a_fast_post_is_served_as_starlette_serves_it(case: str) -> None:
    theirs = await _serve(_app(Starlette), "POST", "/v1/chat/completions", case)
    ours = await _serve(_app(Dispatch), "POST", "/v1/chat/completions", case)
    # The handler is given a ProxyRequest either way (``endpoint``).
    assert ("request", ProxyRequest) in ours[2]
    assert ours == theirs
    assert ("held", None) in ours[2]  # the body's hold released, whatever happened


async def test_only_a_fast_routes_post_skips_the_router() -> None:
    app = _app(Dispatch)
    await _serve(app, "POST", "/v1/chat/completions", "ok")  # builds the stacks

    async def no_router(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("Starlette's stack")

    app.middleware_stack = no_router
    out, raised, _ = await _serve(app, "POST", "/v1/chat/completions", "ok")
    assert raised is None
    assert out[0]["status"] == 200
    for method, path in [("GET", "/v1/chat/completions"), ("POST", "/v1/other")]:
        assert (await _serve(app, method, path, "ok"))[1][1] == "Starlette's stack"


async def test_a_fast_route_must_be_the_one_the_router_picks() -> None:
    first = Route("/v1/{path:path}", endpoint(other), methods=["POST"])
    shadowed = Route("/v1/chat/completions", endpoint(chat), methods=["POST"])
    app = Dispatch(fast=[shadowed], routes=[first, shadowed])
    with pytest.raises(ValueError, match="would not pick"):
        app.build_middleware_stack()
    any_method = Route("/v1/chat/completions", endpoint(chat), methods=["POST", "PUT"])
    with pytest.raises(ValueError, match="POST only"):
        Dispatch(fast=[any_method], routes=[any_method]).build_middleware_stack()
