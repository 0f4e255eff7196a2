"""Finishing a request's ``Record`` (record.py): its metrics observed, its line written.

``Recorder.finish`` is the one place that does either, once per request, so it is
kept to plain work: the series a request moves are looked up once per label set and
observed without prometheus-client's per-call checks and locks (``_FastHistogram``,
``_fast_counter``, tally.py), and the line's values gathered in one tuple (line.py):
its fields are made and formatted on the log writer's thread.
"""

from __future__ import annotations

from bisect import bisect_left
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import Counter, Histogram

from proxy.observe.ledger import Ledger
from proxy.observe.line import LOGGED_VALUE_CHARS as LOGGED_VALUE_CHARS
from proxy.observe.line import AccessLine, gathered
from proxy.observe.line import api_resource as api_resource
from proxy.observe.line import clipped as clipped
from proxy.observe.logs import request_line_writer
from proxy.observe.metrics import Metrics
from proxy.observe.metrics.series import CHAT_STATUSES, DEGRADED_REASONS, status_label
from proxy.observe.tally import Tally, Value, plain_buckets, plain_child

if TYPE_CHECKING:
    from proxy.config import Settings
    from proxy.observe.record import Record

# A request's duration, response, and (when it called the upstream) the upstream call's
# duration and response and the time added (recorder.py's series).
_Series = tuple["_FastHistogram", Value, tuple["_FastHistogram", Value, "_FastHistogram"] | None]
_SERIES_KEPT = 512
# Answered with no response at all (the client left, or shutdown cut it): nginx's code.
NO_RESPONSE = 499


class _FastHistogram:
    """One labelled histogram child's ``observe``: its sum and the one bucket the value
    falls in, as prometheus-client's own does, without its checks and loop (a child
    from ``labels()`` is always observable), on plain values (tally.py), added to in
    place when they are ``Tally``s. Works on its values in multiprocess mode too;
    tests/observe/test_metrics.py holds it to the public ``observe``."""

    __slots__ = ("_bounds", "_buckets", "_plain", "_sum", "observe")

    def __init__(self, child: Histogram) -> None:
        self._sum = plain_child(child, "_sum")
        self._buckets = plain_buckets(child)
        self._bounds = child._upper_bounds  # ascending, ending with +Inf
        values = (self._sum, *self._buckets)
        if all(type(value) is Tally for value in values):
            self._plain = cast("tuple[Tally, list[Tally]]", (self._sum, self._buckets))
            self.observe = self._observe_plain
        else:
            self.observe = self._observe

    def _observe(self, amount: float) -> None:
        self._sum.inc(amount)
        self._buckets[bisect_left(self._bounds, amount)].inc(1)

    def _observe_plain(self, amount: float) -> None:
        total, buckets = self._plain
        total.value += amount
        buckets[bisect_left(self._bounds, amount)].value += 1


def _fast_counter(child: Counter) -> Value:
    """One labelled counter child's value, plain (tally.py): ``inc`` it by amounts >= 0."""
    return plain_child(child)


class Recorder:
    """Observes each finished request's metrics and writes its line; one per app."""

    def __init__(self, metrics: Metrics, settings: Settings, ledger: Ledger | None = None) -> None:
        self.metrics = metrics
        self.ledger = ledger or Ledger(metrics.registry, settings.pricing)
        self._line = AccessLine(settings.logging.include_sensitive)
        # Keyed by route (a route name) and status label: closed sets (metrics/series.py).
        self._durations: dict[str, _FastHistogram] = {}
        self._upstream: dict[str, _FastHistogram] = {}
        self._responses: dict[tuple[str, str], Value] = {}
        self._upstream_responses: dict[tuple[str, str], Value] = {}
        self._added: dict[str, _FastHistogram] = {}
        self._ttfb: dict[str, _FastHistogram] = {}
        # The above, by route, status and upstream status: one look-up a request.
        self._series: dict[tuple[str, int, int | None], _Series] = {}
        self._chat = {s: _fast_counter(metrics.requests.labels(status=s)) for s in CHAT_STATUSES}
        self._degraded = {
            r: _fast_counter(metrics.degraded_requests.labels(reason=r)) for r in DEGRADED_REASONS
        }
        # The in-flight gauge's value, moved by RecordRequests without Gauge's checks.
        self.in_flight = plain_child(metrics.process.in_flight)
        self._before = _fast_counter(metrics.input_tokens.labels(stage="before"))
        self._after = _fast_counter(metrics.input_tokens.labels(stage="after"))

    def finish(self, rec: Record) -> None:
        """Observe ``rec``'s metrics and log its line; called once, when it has ended."""
        rec.upstream_done()
        total = perf_counter() - rec.started
        if not rec.status:
            rec.status = NO_RESPONSE
        key = (rec.route, rec.status, rec.upstream_status)
        series = self._series.get(key) or self._series_of(key)
        durations, responses, called = series
        durations.observe(total)
        responses.inc(1)
        if called is not None:
            upstream, upstream_responses, added = called
            upstream.observe(rec.upstream_s)
            upstream_responses.inc(1)
            added.observe(max(total - rec.upstream_s, 0.0))
        if rec.event_stream and rec.ttfb_s is not None:
            _histogram(self._ttfb, self.metrics.stream_ttfb, rec.route).observe(rec.ttfb_s)
        if rec.summary_failed_s:
            self.metrics.failed_summary_seconds.inc(rec.summary_failed_s)
        outcome = rec.outcome
        if outcome is not None and rec.upstream_status:  # chat requests the upstream answered
            self._chat[outcome.status].inc(1)
            if outcome.degraded is not None:
                self._degraded[outcome.degraded].inc(1)
            before = rec.tokens_before
            self._before.inc(outcome.tokens if before is None else before)
            self._after.inc(outcome.tokens)
        ledgered = self.ledger.finish(rec)
        rec.finished = True  # a summary from now on goes to the ledger alone
        write = request_line_writer()
        if write is not None:  # its values now, its fields and format on the writer's thread
            named = None
            if rec.model is not None and rec.session is None and rec.session_header:
                named = self.ledger.named.of(rec.tenant, rec.session_header)[1]
            write(rec.request_id, self._line.fields, gathered(rec, total, named, ledgered))

    def _series_of(self, key: tuple[str, int, int | None]) -> _Series:
        """The series a request of ``key`` (route, status, upstream status) moves, kept
        for the next one (up to ``_SERIES_KEPT`` keys: statuses come from upstreams)."""
        route, status, upstream_status = key
        m = self.metrics
        called = None
        if upstream_status is not None:  # these only for routes that call the upstream
            called = (
                _histogram(self._upstream, m.upstream_duration, route),
                _counter(self._upstream_responses, m.upstream_responses, route, upstream_status),
                _histogram(self._added, m.added_latency, route),
            )
        series = (
            _histogram(self._durations, m.request_duration, route),
            _counter(self._responses, m.responses, route, status),
            called,
        )
        if len(self._series) < _SERIES_KEPT:
            self._series[key] = series
        return series

    def _fields(self, rec: Record, total: float) -> dict[str, Any]:
        """``rec``'s line's fields but the ledger's, as the writer makes them."""
        named = None
        if rec.model is not None and rec.session is None and rec.session_header:
            named = self.ledger.named.of(rec.tenant, rec.session_header)[1]
        return self._line.fields(gathered(rec, total, named))


def _histogram(cache: dict[str, _FastHistogram], family: Histogram, route: str) -> _FastHistogram:
    child = cache.get(route)
    if child is None:
        child = cache[route] = _FastHistogram(family.labels(route=route))
    return child


def _counter(
    cache: dict[tuple[str, str], Value], family: Counter, route: str, status: int
) -> Value:
    key = (route, status_label(status))
    child = cache.get(key)
    if child is None:
        child = cache[key] = _fast_counter(family.labels(route=route, status=key[1]))
    return child
