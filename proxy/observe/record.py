"""One record per request: what it did, observed in metrics and logged as one line at its end.

``RecordRequests`` wraps the routes (ASGI middleware). For each request it opens a
``Record`` under the request's id (``request_id.py``: the client's, or a new one),
which it puts on the request's own headers, so it is forwarded upstream like any
other header (summaries asked for the request carry it too), and on the response.
The steps fill in what they learn: the
pipeline the model, the compaction outcome and the tokens, the upstream timing; the
steps below it (the compactor, the summary) reach the record as ``current_record()``,
which the middleware sets as it sets the request id of log lines.
When the response has ended (a stream: after its last byte, or when its client
left) ``Recorder.finish`` (recorder.py) observes the request's metrics and writes
its line: the one place that does either.
Health, readiness and metrics scrapes are not recorded.

The record is at the bottom of what observes a request: the middleware
(record_requests.py), the recorder, the line and the ledgers read it; it knows the
ledger only as ``Books``, what a record asks of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

from starlette.requests import Request

from proxy.observe.request_id import new_request_id

if TYPE_CHECKING:
    from proxy.core.cache_cuts import CachePlan
    from proxy.core.history import History
    from proxy.core.outcome import Outcome, Turn
    from proxy.core.session import SessionKey
    from proxy.types import ChatMessage

SCOPE_KEY = "proxy.record"  # where RecordRequests puts a request's record in its scope
# The record of the request being served, as REQUEST_ID is its id (logs.py): the steps
# below the pipeline (a summary's time, its trigger) note on it without being handed it.
CURRENT: ContextVar[Record | None] = ContextVar("proxy_record", default=None)


class Books(Protocol):
    """What a record asks of the ledger it is filed with (observe/ledger.py's ``Ledger``)."""

    def caches(self, rec: Record) -> bool: ...
    def warm(self, rec: Record, now: float) -> bool: ...
    def late(
        self, rec: Record, model: str, summarized: tuple[int, int, bool], cached: int = 0
    ) -> None: ...


@dataclass(slots=True)
class Record:
    """What one request did, filled in as it goes; finished once, by the middleware."""

    request_id: str
    started: float
    method: str = ""
    path: str = ""
    route: str = "other"
    read_at: float = 0.0  # when its body was in (a compacting API's; 0: not read so)
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
    summary_failed_s: float = 0.0  # in summaries that failed: its own, or waiting (compact.py)
    # Upstream calls: their time so far, when the one under way was sent (0: none is),
    # and the status of the last answer (None: never called; 0: no answer).
    upstream_s: float = 0.0
    upstream_sent_at: float = 0.0
    upstream_status: int | None = None
    upstream_request_id: str | None = None
    # The response as it went out; its first byte's time and whether it ended: an event
    # stream's (noted for those only).
    event_stream: bool = False
    ttfb_s: float | None = None
    completed: bool = False
    # The ledger's facts (observe/ledger.py): the upstream's usage of the view answered
    # (input tokens, of them cached; None: the answer carried none), and the summarizer's
    # (input, output, estimated) and model; once finished, a summary goes to ``ledger``.
    # ``summarizer_spent``: every summarizer call's input + output, finished or not (the
    # tenant caps' measure, compaction/caps.py).
    usage: tuple[int, int] | None = None
    # Of the input, what the provider's cache wrote by tier (5 minutes, an hour; None:
    # the answer said nothing of writes); when the view answered was sent; the client's
    # messages and their digests (the cache outcome's, observe/cache_ledger.py).
    cache_writes: tuple[int, int] | None = None
    sent_at: float = 0.0
    messages: Sequence[ChatMessage] | None = None
    digests: Sequence[bytes] | None = None
    # A cache-aware turn's plan for a snapshot newer than the view served last
    # (compaction/held.py): held, or why it was applied; None: no such choice was made.
    cache_plan: CachePlan | None = None
    summarized: tuple[int, int, bool] = (0, 0, False)
    summary_cached: int = 0  # of summarized's input, what the provider's cache served
    summarizer_spent: int = 0
    summarizer_model: str | None = None
    ledger: Books | None = None
    finished: bool = False

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
        self.messages = turn.chat["messages"]

    def counted(self, session: SessionKey, history: History) -> None:
        """The chat's session and the tokens of its history as sent."""
        self.session = session
        self.tokens_before = sum(history.counts) + history.fixed
        self.digests = history.digests

    def sending(self, outcome: Outcome | None = None) -> None:
        """An upstream call (with the view ``outcome``) is sent: its time counts until
        ``upstream_done``, or until the request ends (the answer is relayed as it is read)."""
        self.upstream_done()
        self.upstream_sent_at = self.sent_at = perf_counter()
        self.upstream_status = 0
        if outcome is not None:
            self.outcome = outcome

    def upstream_done(self) -> None:
        """The upstream's answer was read whole (an error the proxy acts on)."""
        if self.upstream_sent_at:
            self.upstream_s += perf_counter() - self.upstream_sent_at
            self.upstream_sent_at = 0.0

    def used(
        self, input_tokens: int | None, cached: int | None, writes: tuple[int, int] | None = None
    ) -> None:
        """What the upstream's answer says the view cost: its input tokens, cached ones,
        and what its cache wrote by tier."""
        if writes is not None:
            self.cache_writes = writes
        if input_tokens is not None:
            self.usage = (input_tokens, 0 if self.usage is None else self.usage[1])
        if cached is not None and self.usage is not None:
            self.usage = (self.usage[0], cached)

    def summary_used(self, model: str, tokens: tuple[int, int, bool], cached: int = 0) -> None:
        """One summarizer call's input and output tokens (and whether estimated), and of
        its input what the provider's cache served."""
        self.summarizer_spent += tokens[0] + tokens[1]
        if self.finished:
            if self.ledger is not None:
                self.ledger.late(self, model, tokens, cached)
            return
        given, written, estimated = self.summarized
        self.summarized = (given + tokens[0], written + tokens[1], estimated or tokens[2])
        self.summary_cached += cached
        self.summarizer_model = model

    def answered(self, upstream_status: int, outcome: Outcome | None = None) -> None:
        """The upstream answered (the view ``outcome``, after any recovery)."""
        self.upstream_status = upstream_status
        if outcome is not None:
            self.outcome = outcome


def record_of(request: Request) -> Record:
    """The request's record (a fresh one, never logged, outside ``RecordRequests``)."""
    record: Record | None = request.scope.get(SCOPE_KEY)
    return Record.detached() if record is None else record


def current_record() -> Record:
    """The record of the request this code runs for (its background work included: a
    task started while serving it inherits it), or, outside ``RecordRequests``, a fresh
    one never logged."""
    record = CURRENT.get()
    return Record.detached() if record is None else record


@contextmanager
def recording(record: Record) -> Iterator[Record]:
    """``record`` as the current one within the block, and in the tasks started there
    (they copy the context): for code that serves a request outside ``RecordRequests``."""
    token = CURRENT.set(record)
    try:
        yield record
    finally:
        CURRENT.reset(token)
