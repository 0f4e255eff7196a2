"""Route endpoints as plain ASGI apps.

Starlette wraps a function endpoint in ``request_response``, which adds a second
exception-handling layer per request (the app's own ``ExceptionMiddleware`` already
catches what the handlers raise, with the same handlers). ``endpoint(handler)`` calls the
handler itself, with the request ``shortcuts/starlette_request.py`` makes, and releases
the request's body budget when it is done. An ASGI app as a route's endpoint is
Starlette's public API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.compaction.inflight import release
from proxy.shortcuts.starlette_request import request_class

Handler = Callable[[Request], Awaitable[Response]]


class endpoint:  # lower case: wraps a handler where a function would
    """``handler`` as an ASGI app (a class, so that ``Route`` takes it as one).

    ``release`` frees the request's body budget once the handler is done (the fast
    routes' ``FastRoute`` calls it as this does).

    What the handler raises propagates to the app's ``ExceptionMiddleware``, whose
    handlers answer it as they would have at the route.
    """

    __slots__ = ("handler",)
    release = staticmethod(release)

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self.handler(request_class()(scope, receive, send))
            await response(scope, receive, send)
        finally:
            # Answered, failed or abandoned: the body it held is no longer held.
            release(scope)
