"""``RecordRequests``, the ASGI middleware that gives each request its ``Record``
(record.py) under the request's id, puts the id on both hops and has the recorder
finish the record once the response has ended (a stream: after its last byte, or when
its client left). Health, readiness and metrics scrapes are not recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable
from time import perf_counter
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.observe.logs import REQUEST_ID
from proxy.observe.record import CURRENT, SCOPE_KEY, Record
from proxy.observe.request_id import HEADER, request_id_from, response_headers

if TYPE_CHECKING:
    from proxy.observe.recorder import Recorder

_UNRECORDED = frozenset({"/healthz", "/readyz", "/metrics"})


class RecordRequests:
    """ASGI middleware: a ``Record`` per request, its id on both hops, finished at the end."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        recorder: Recorder | None = state.get("recorder") if state else None
        if scope["type"] != "http" or recorder is None or scope["path"] in _UNRECORDED:
            await self.app(scope, receive, send)
            return
        request_id, scope["headers"] = request_id_from(scope["headers"])
        rec = Record(request_id, perf_counter(), scope["method"], scope["path"])
        rec.ledger = recorder.ledger
        scope[SCOPE_KEY] = rec
        own = (HEADER, request_id.encode("ascii"))

        def send_recorded(message: Message) -> Awaitable[None]:
            # Not a coroutine: ``send``'s own is what the caller awaits (a frame and a
            # coroutine fewer a message); what it notes is noted before that runs, as it was.
            if message["type"] == "http.response.start":
                rec.status = message["status"]
                headers, upstream_id, rec.event_stream = response_headers(
                    message.get("headers", ()), own
                )
                message["headers"] = headers
                rec.upstream_request_id = upstream_id
                if rec.event_stream:
                    recorder.metrics.active_streams.inc()
            elif rec.event_stream and message["type"] == "http.response.body":  # its first
                # byte's time and its end: a stream's (a line has them for streams only)
                if rec.ttfb_s is None and message.get("body"):
                    rec.ttfb_s = perf_counter() - rec.started
                if not message.get("more_body", False):
                    rec.completed = True
            return send(message)

        token, current = REQUEST_ID.set(request_id), CURRENT.set(rec)
        in_flight = recorder.in_flight
        in_flight.inc(1)
        try:
            await self.app(scope, receive, send_recorded)
        except Exception:
            rec.status = rec.status or 500
            raise
        finally:
            in_flight.inc(-1)
            if rec.event_stream:
                recorder.metrics.active_streams.dec()
            route = scope.get("route")
            rec.route = getattr(route, "name", None) or "other"
            recorder.finish(rec)
            CURRENT.reset(current)
            REQUEST_ID.reset(token)
