"""The compacting routes' POSTs, straight to their handler.

Starlette serves a request through its stack: ``ServerErrorMiddleware``, the app's
middleware (``RecordRequests``), ``ExceptionMiddleware`` (a ``Request`` and two closures
a request), the router (a regular expression per route it tries), the route, the
endpoint; and every time the request resumes (the upstream's answer in), each of those
frames resumes too. ``Dispatch`` is that ``Starlette`` app, except that a ``POST`` to
the path of one of its ``fast`` routes goes through the app's middleware to
``FastRoute``: one frame that does what ``ExceptionMiddleware``, the router, the route
and the endpoint would have done for it; and ``Dispatch.__call__``'s own frame does
what Starlette's ``ServerErrorMiddleware`` would have done around them (its send
wrapper a plain function, not a coroutine a message). It leaves the same keys in the
scope, calls the same handler and, when that raises, the same exception handler (a
handled exception once the answer has started is the same ``RuntimeError``), and an
exception that goes past them the same 500. Every other request goes Starlette's way.

It reads Starlette 1.10's internals (``ExceptionMiddleware``'s handler tables, the scope
key they go under, ``ServerErrorMiddleware``'s answers): ``application()`` builds it on that
series, else a plain ``Starlette`` with the same routes, which serves them its own way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from inspect import iscoroutinefunction
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.shortcuts.gate import missing, on
from proxy.shortcuts.starlette_request import ProxyRequest

try:  # what only Dispatch uses: another release may have moved it (then it is off)
    from starlette._utils import is_async_callable
    from starlette.middleware.body_limit import RequestBodyLimitMiddleware
except ImportError as exc:
    missing("starlette", exc)

_HANDLERS = "starlette.exception_handlers"  # where ExceptionMiddleware puts its handlers


class Endpoint(Protocol):
    """A fast route's app (routes/endpoints.py ``endpoint``): the handler it calls, and
    what it does with the scope once the handler is done."""

    handler: Callable[[Request], Awaitable[Response]]

    def release(self, scope: Scope) -> None: ...


class FastRoute:
    """``route`` (its app an ``Endpoint``) as ``answers`` (the app's
    ``ExceptionMiddleware``), its router and the route itself would serve it."""

    __slots__ = ("handler", "handlers", "release", "route", "router")

    def __init__(self, route: Route, router: ASGIApp, answers: ExceptionMiddleware) -> None:
        app: Endpoint = route.app  # type: ignore[assignment]  # checked below
        assert all(hasattr(app, name) for name in ("handler", "release")), route.path
        self.route, self.router, self.handler = route, router, app.handler
        self.release = app.release
        self.handlers = (answers._exception_handlers, answers._status_handlers)
        handlers = (*self.handlers[0].values(), *self.handlers[1].values())
        assert all(iscoroutinefunction(h) for h in handlers), "exception handlers: async"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[_HANDLERS] = self.handlers
        scope.setdefault("router", self.router)
        scope["route"] = route = self.route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        started = False

        def sender(message: Message) -> Awaitable[None]:
            # Not a coroutine: ``send``'s own is what the caller awaits (one frame and one
            # coroutine less a message); started is noted before it runs, as it was.
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            return send(message)

        request = ProxyRequest(scope, receive, sender)
        try:
            try:
                response = await self.handler(request)
                await response(scope, receive, sender)
            finally:
                # Answered, failed or abandoned: the body it held is no longer held.
                self.release(scope)
        except Exception as exc:  # as ExceptionMiddleware answers it
            handler = self._handler_for(exc)
            if handler is None:
                raise
            if started:
                message = "Caught handled exception, but response already started."
                raise RuntimeError(message) from exc
            answer = await handler(request, exc)
            if answer is not None:
                await answer(scope, receive, sender)
            exc.__traceback__ = None  # a reused exception would pile up tracebacks

    def _handler_for(self, exc: Exception) -> Any:
        by_class, by_status = self.handlers
        if isinstance(exc, HTTPException) and exc.status_code in by_status:
            return by_status[exc.status_code]
        return next((by_class[c] for c in type(exc).__mro__ if c in by_class), None)


class Dispatch(Starlette):
    """``Starlette``, whose ``POST`` to the path of a route in ``fast`` skips its router
    and ``ExceptionMiddleware`` (``FastRoute``), and ``ServerErrorMiddleware``'s frame."""

    def __init__(self, *, fast: Sequence[Route], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_routes = tuple(fast)
        self._fast: dict[str, ASGIApp] = {}
        self._errors = ServerErrorMiddleware(self, debug=self.debug)

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, and beside it one per fast route, built the same way
        with ``FastRoute`` in place of ``ExceptionMiddleware`` and the router."""
        stack = super().build_middleware_stack()
        error_handler, handlers = None, {}
        for key, value in self.exception_handlers.items():  # as Starlette splits them
            if key in (500, Exception):
                error_handler = value
            else:
                handlers[key] = value
        answers = ExceptionMiddleware(self.router, handlers=handlers, debug=self.debug)
        for route in self.fast_routes:
            _check_first(self, route)
            app: ASGIApp = FastRoute(route, self.router, answers)
            for cls, args, kwargs in reversed(self.user_middleware):
                app = cls(app, *args, **kwargs)
            if self.max_body_size is not None:
                app = RequestBodyLimitMiddleware(app, max_body_size=self.max_body_size)
            self._fast[route.path] = app
        # Its answers to an exception (its __call__ is this one's, for the fast routes).
        self._errors = ServerErrorMiddleware(self, error_handler, self.debug)
        return stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        # Its path is the route's path only without a root path (get_route_path).
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            fast = self._fast.get(scope["path"])
            if fast is not None:  # as ServerErrorMiddleware serves it, in this frame
                started = False

                def sender(message: Message) -> Awaitable[None]:
                    nonlocal started  # not a coroutine: ``send``'s is what is awaited
                    if message["type"] == "http.response.start":
                        started = True
                    return send(message)

                try:
                    await fast(scope, receive, sender)
                except Exception as exc:  # a 500 if none started; the server gets exc
                    await self._server_error(exc, started, (scope, receive, send))
                    raise
                return
        await self.middleware_stack(scope, receive, send)

    async def _server_error(
        self, exc: Exception, started: bool, asgi: tuple[Scope, Receive, Send]
    ) -> None:
        """What ``ServerErrorMiddleware`` does with ``exc``: its answer (the debug page,
        the app's 500 handler or its own), sent unless the response had ``started``."""
        scope, receive, send = asgi
        errors, request = self._errors, Request(scope)
        handler: Any = errors.handler  # starlette's type for it is any handler's
        response: Response
        if errors.debug:
            response = await run_in_threadpool(errors.debug_response, request, exc)
        elif handler is None:
            response = errors.error_response(request, exc)
        elif is_async_callable(handler):
            response = await handler(request, exc)
        else:
            response = await run_in_threadpool(handler, request, exc)
        if not started:
            await response(scope, receive, send)


def _check_first(app: Starlette, route: Route) -> None:
    """``route`` must be what the router picks for a POST to its path: the first of the
    app's routes to match it in full; POST only, its path without parameters."""
    if route.methods != {"POST"} or route.param_convertors:
        raise ValueError(f"{route.path}: a fast route is POST only, without parameters")
    scope = {"type": "http", "path": route.path, "method": "POST", "root_path": ""}
    first = next((r for r in app.router.routes if r.matches(scope)[0] is Match.FULL), None)
    if first is not route:
        raise ValueError(f"{route.path}: the router would not pick this route for a POST")


def application(*, fast: Sequence[Route], **kwargs: Any) -> Starlette:
    """``Dispatch(fast=fast, **kwargs)`` on the tested Starlette series, else
    ``Starlette(**kwargs)``: the same routes, every request served Starlette's way."""
    if on("starlette"):
        return Dispatch(fast=fast, **kwargs)
    return Starlette(**kwargs)
