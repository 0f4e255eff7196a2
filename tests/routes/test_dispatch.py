"""A fast route's POST (shortcuts/starlette_routing.py) is served as Starlette would serve
it: the same messages out, the same exception raised, the same scope keys, without the
router."""

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
from proxy.config import ServerSettings, Settings
from proxy.errors import InvalidRequest, ProxyError
from proxy.observe.metrics import Metrics
from proxy.observe.record_requests import RecordRequests
from proxy.observe.recorder import Recorder
from proxy.routes.endpoints import endpoint
from proxy.shortcuts.starlette_request import ProxyRequest
from proxy.shortcuts.starlette_routing import Dispatch

# Tests of the shortcuts themselves: on, whatever the run's switch.
pytestmark = pytest.mark.usefixtures("shortcuts_on")

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


async def on_server_error(request: Request, exc: Exception) -> Response:
    SEEN.append(("server error", type(exc).__name__))
    return Response("ours", 500)


def on_server_error_sync(request: Request, exc: Exception) -> Response:
    SEEN.append(("server error, sync", type(exc).__name__))
    return Response("ours, sync", 500)


@pytest.mark.parametrize("case", ["crash", "late", "ok"])
@pytest.mark.parametrize("answer", [on_server_error, on_server_error_sync, "debug"])
async def test_an_exception_past_a_fast_route_is_answered_as_starlette_answers_it(
    case: str, answer: Any
) -> None:
    """Dispatch's own frame does ServerErrorMiddleware's work for a fast route: the app's
    500 handler (async or not) called even once the answer started, its answer sent only
    if none did, the exception raised on; in debug, the traceback page."""
    apps = []
    for kind in (Starlette, Dispatch):
        app = _app(kind)
        if answer == "debug":
            app.debug = True
        else:
            app.add_exception_handler(Exception, answer)
        apps.append(app)
    theirs, ours = [await _serve(app, "POST", "/v1/chat/completions", case) for app in apps]
    if answer == "debug":  # the page shows each one's frames: the same page, not the same text
        for served in (theirs, ours):
            if case == "crash":  # the traceback, as text for a client that takes no HTML
                assert b"KeyError: 'boom'" in served[0][1]["body"]
            for message in served[0]:
                message.pop("body", None)
                message.pop("headers", None)
    assert ours == theirs


class _Sent:
    """What a server's ``send`` returns: awaited once, by whoever it was handed to."""

    def __await__(self) -> Any:
        yield from ()


async def test_a_fast_routes_messages_reach_the_server_through_no_coroutine() -> None:
    """The send wrappers above a fast route (FastRoute's, RecordRequests', Dispatch's own
    for ServerErrorMiddleware) hand each message down and return the server's awaitable:
    no coroutine (and frame) made a message per layer."""
    returned: list[object] = []

    class Probe(Response):
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await super().__call__(scope, receive, lambda m: _noted(returned, send(m)))

    async def probe(request: Request) -> Response:
        return Probe(b"x")

    fast = Route("/v1/chat/completions", endpoint(probe), methods=["POST"], name="chat")
    app = Dispatch(fast=[fast], routes=[fast], middleware=[Middleware(RecordRequests)])
    recorder = Recorder(Metrics.create(), Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    sent: list[object] = []

    def send(message: Message) -> Any:
        return _noted(sent, _Sent())

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "root_path": ""}
    scope.update(headers=[], query_string=b"", state={"recorder": recorder})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}"}

    await app(scope, receive, send)
    assert len(sent) == 2
    assert [id(x) for x in returned] == [id(x) for x in sent]


def _noted(into: list[object], awaitable: Any) -> Any:
    into.append(awaitable)
    return awaitable
