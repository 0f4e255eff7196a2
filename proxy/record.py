"""One record per request: what it did, observed in metrics and logged as one line at its end.

``RecordRequests`` wraps the routes (ASGI middleware). For each request it opens a
``Record`` under the request's id (``request_id.py``: the client's, or a new one),
which it puts on the request's own headers, so it is forwarded upstream like any
other header (summaries asked for the request carry it too), and on the response.
The steps fill in what they learn: the
pipeline the model, the compaction outcome and the tokens, the upstream timing.
When the response has ended (a stream: after its last byte, or when its client
left) ``Recorder.finish`` observes the request's metrics and writes its line: the
one place that does either.
Health, readiness and metrics scrapes are not recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.logs import ACCESS, REQUEST_ID, write_request_line
from proxy.metrics import CHAT_STATUSES, Metrics
from proxy.request_id import HEADER, new_request_id, request_id_from, response_headers
from proxy.session import SessionKey, session_from_header

if TYPE_CHECKING:
    from proxy.config import Settings
    from proxy.count import History
    from proxy.outcome import Outcome, Turn

_UNRECORDED = frozenset({"/healthz", "/readyz", "/metrics"})
_SCOPE_KEY = "proxy.record"
# Answered with no response at all (the client left, or shutdown cut it): nginx's code.
_NO_RESPONSE = 499


# OpenAI's API resources: a passthrough line names one of these, or "other". The rest of
# a path is the caller's (file ids, names, anything a client puts there), logged only
# with logging.include_sensitive.
_RESOURCES = frozenset(
    "assistants audio batches chat completions containers conversations embeddings evals "  # noqa: SIM905
    "files fine_tuning images models moderations realtime responses threads uploads "
    "vector_stores".split()
)


def api_resource(path: str) -> str:
    """``/v1/files/file-abc/content`` -> ``/v1/files/…``; an unknown resource -> ``other``."""
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[1] != "v1" or parts[2] not in _RESOURCES:
        return "other"
    return f"/v1/{parts[2]}" + ("/…" if len(parts) > 3 else "")


@dataclass(slots=True)
class Record:
    """What one request did, filled in as it goes; finished once, by the middleware."""

    request_id: str
    started: float
    method: str = ""
    path: str = ""
    route: str = "other"
    status: int = 0  # the HTTP status sent; 0 until the response starts
    error: str | None = None  # the proxy's error code, when it answered with one
    # Chat requests, from the pipeline.
    model: str | None = None
    window: int | None = None  # the model's context window, as the proxy uses it
    stream: bool = False
    tenant: str = ""
    session_header: str | None = None
    session: SessionKey | None = None
    outcome: Outcome | None = None
    tokens_before: int | None = None  # the history as the client sent it, when counted
    trigger: str | None = None
    summary_s: float | None = None
    # Upstream calls: their time so far, when the one under way was sent (0: none is),
    # and the status of the last answer (None: never called; 0: no answer).
    upstream_s: float = 0.0
    upstream_sent_at: float = 0.0
    upstream_status: int | None = None
    upstream_request_id: str | None = None
    # The response as it went out.
    event_stream: bool = False
    ttfb_s: float | None = None
    completed: bool = False

    @classmethod
    def detached(cls) -> Record:
        """A record no middleware finishes: never observed, never logged."""
        return cls(new_request_id(), perf_counter())

    def note_request(self, model: str, tenant: str, *, stream: bool, window: int) -> None:
        """A chat (or Responses) request's model, its window, its tenant, and whether it
        streams."""
        self.model = model
        self.window = window
        self.tenant = tenant
        self.stream = stream

    def note_turn(self, turn: Turn) -> None:
        """A chat (or Responses) request's model, tenant and session header."""
        model, stream = turn.model, bool(turn.chat.get("stream"))
        self.note_request(model.name, turn.tenant, stream=stream, window=model.context_window)
        self.session_header = turn.session_header

    def counted(self, session: SessionKey, history: History) -> None:
        """The chat's session and the tokens of its history as sent."""
        self.session = session
        self.tokens_before = sum(history.counts) + history.fixed

    def sending(self, outcome: Outcome | None = None) -> None:
        """An upstream call (with the view ``outcome``) is sent: its time counts until
        ``upstream_done``, or until the request ends (the answer is relayed as it is read)."""
        self.upstream_done()
        self.upstream_sent_at = perf_counter()
        self.upstream_status = 0
        if outcome is not None:
            self.outcome = outcome

    def upstream_done(self) -> None:
        """The upstream's answer was read whole (an error the proxy acts on)."""
        if self.upstream_sent_at:
            self.upstream_s += perf_counter() - self.upstream_sent_at
            self.upstream_sent_at = 0.0

    def answered(self, upstream_status: int, outcome: Outcome | None = None) -> None:
        """The upstream answered (the view ``outcome``, after any recovery)."""
        self.upstream_status = upstream_status
        if outcome is not None:
            self.outcome = outcome


def record_of(request: Request) -> Record:
    """The request's record (a fresh one, never logged, outside ``RecordRequests``)."""
    record: Record | None = request.scope.get(_SCOPE_KEY)
    return Record.detached() if record is None else record


class Recorder:
    """Observes each finished request's metrics and writes its line; one per app.

    Label children are looked up once per label set and kept: ``labels()`` hashes
    and locks on every call.
    """

    def __init__(self, metrics: Metrics, settings: Settings) -> None:
        self.metrics = metrics
        self._include_sensitive = settings.logging.include_sensitive
        self._durations: dict[tuple[str, int], Histogram] = {}
        self._upstream: dict[tuple[str, int], Histogram] = {}
        self._added: dict[str, Histogram] = {}
        self._ttfb: dict[str, Histogram] = {}
        self._chat = {s: metrics.requests.labels(status=s) for s in CHAT_STATUSES}
        self._before = metrics.input_tokens.labels(stage="before")
        self._after = metrics.input_tokens.labels(stage="after")

    def finish(self, rec: Record) -> None:
        """Observe ``rec``'s metrics and log its line; called once, when it has ended."""
        rec.upstream_done()
        total = perf_counter() - rec.started
        route, m = rec.route, self.metrics
        if not rec.status:
            rec.status = _NO_RESPONSE
        _child(self._durations, m.request_duration, route, rec.status).observe(total)
        if rec.upstream_status is not None:
            up = _child(self._upstream, m.upstream_duration, route, rec.upstream_status)
            up.observe(rec.upstream_s)
            added = self._added.get(route) or self._added.setdefault(
                route, m.added_latency.labels(route=route)
            )
            added.observe(max(total - rec.upstream_s, 0.0))
        if rec.event_stream and rec.ttfb_s is not None:
            ttfb = self._ttfb.get(route) or self._ttfb.setdefault(
                route, m.stream_ttfb.labels(route=route)
            )
            ttfb.observe(rec.ttfb_s)
        outcome = rec.outcome
        if outcome is not None and rec.upstream_status:  # chat requests the upstream answered
            self._chat[outcome.status].inc()
            before = rec.tokens_before
            self._before.inc(outcome.tokens if before is None else before)
            self._after.inc(outcome.tokens)
        if ACCESS.isEnabledFor(logging.INFO):
            write_request_line(self._fields(rec, total))

    def _fields(self, rec: Record, total: float) -> dict[str, Any]:
        """The line's fields: hashed ids, never content, credentials or header values."""
        fields: dict[str, Any] = {
            "request_id": rec.request_id,
            "method": rec.method,
            "route": rec.route,
            "status": rec.status,
            "duration_ms": round(total * 1000, 2),
        }
        if rec.route == "passthrough":  # other paths can hold a session id
            fields["path"] = rec.path if self._include_sensitive else api_resource(rec.path)
        if rec.error is not None:
            fields["error"] = rec.error
        if rec.upstream_status is not None:
            fields["upstream_status"] = rec.upstream_status or None
            fields["upstream_ms"] = round(rec.upstream_s * 1000, 2)
        if rec.upstream_request_id is not None:
            fields["upstream_request_id"] = rec.upstream_request_id
        if rec.event_stream:
            if rec.ttfb_s is not None:
                fields["ttfb_ms"] = round(rec.ttfb_s * 1000, 2)
            fields["completed"] = rec.completed
        if rec.model is not None:
            fields.update(self._chat_fields(rec))
        return fields

    def _chat_fields(self, rec: Record) -> dict[str, Any]:
        fields: dict[str, Any] = {"model": rec.model, "stream": rec.stream}
        # The same ids /admin/sessions shows for tenants, and every other line for sessions.
        fields["tenant"] = rec.tenant[:12]
        session = rec.session
        if session is None and rec.session_header:
            session = session_from_header(rec.tenant, rec.session_header)
        if session is not None:
            fields["session"] = session.log_id
        if self._include_sensitive and rec.session_header is not None:
            fields["session_header"] = rec.session_header
        outcome = rec.outcome
        if outcome is not None:
            fields["compaction"] = outcome.status
            before = rec.tokens_before
            fields["tokens_before"] = outcome.tokens if before is None else before
            fields["tokens_after"] = outcome.tokens
            fields["counted"] = outcome.counted
        if rec.trigger is not None:
            fields["trigger"] = rec.trigger
        if rec.summary_s is not None:
            fields["summary_ms"] = round(rec.summary_s * 1000, 2)
        return fields


def _child(
    cache: dict[tuple[str, int], Histogram], family: Histogram, route: str, status: int
) -> Histogram:
    child = cache.get((route, status))
    if child is None:
        label = str(status) if status else "none"
        child = cache[(route, status)] = family.labels(route=route, status=label)
    return child


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
        scope[_SCOPE_KEY] = rec
        own = (HEADER, request_id.encode("ascii"))

        async def send_recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                rec.status = message["status"]
                headers, upstream_id, rec.event_stream = response_headers(
                    message.get("headers", ()), own
                )
                message["headers"] = headers
                rec.upstream_request_id = upstream_id
                if rec.event_stream:
                    recorder.metrics.active_streams.inc()
            elif message["type"] == "http.response.body":
                if rec.ttfb_s is None and message.get("body"):
                    rec.ttfb_s = perf_counter() - rec.started
                if not message.get("more_body", False):
                    rec.completed = True
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_recorded)
        except Exception:
            rec.status = rec.status or 500
            raise
        finally:
            if rec.event_stream:
                recorder.metrics.active_streams.dec()
            route = scope.get("route")
            rec.route = getattr(route, "name", None) or "other"
            recorder.finish(rec)
            REQUEST_ID.reset(token)
