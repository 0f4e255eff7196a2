"""Issue 10: the series a dashboard needs, in-process: the closed label sets exported at
start-up, and the recorder's fast observe against prometheus_client's.

The series moving as a real proxy works: tests/e2e/test_metrics_e2e.py.
"""

from __future__ import annotations

from time import perf_counter

import pytest

from proxy.config import Settings
from proxy.observe import recorder as recorder_module
from proxy.observe.metrics import Metrics
from proxy.observe.metrics.series import STORE_FAILURE_KINDS
from proxy.observe.metrics.store import FALLBACK_OPERATIONS
from proxy.observe.record import Record
from proxy.observe.recorder import Recorder, _fast_counter, _FastHistogram
from proxy.store.memory import MemoryStore
from proxy.store.resilient import ResilientStore
from tests.support.metrics import Samples


def test_closed_label_sets_are_exported_before_anything_happens() -> None:
    """Dashboards and alerts see zeros, not "no data", on a fresh replica."""
    metrics = Metrics.create()
    registry = metrics.registry
    for trigger in ("threshold", "forced", "overflow_recovery", "scheduled"):
        labels = {"trigger": trigger, "outcome": "compacted"}
        assert registry.get_sample_value("compaction_proxy_compactions_total", labels) == 0
    for operation in ("load", "save", "acquire", "release"):
        labels = {"operation": operation}
        assert registry.get_sample_value("compaction_proxy_store_errors_total", labels) == 0
    assert registry.get_sample_value("compaction_proxy_active_streams") == 0
    # Store calls are timed only with a Redis store, which declares its series when built.
    name = "compaction_proxy_store_duration_seconds_count"
    assert registry.get_sample_value(name, {"operation": "load"}) is None
    ResilientStore(MemoryStore(60), MemoryStore(60), metrics)
    for operation in ("load", "save", "acquire", "release"):
        assert registry.get_sample_value(name, {"operation": operation}) == 0


def test_the_store_health_series_are_exported_at_zero_from_start_up() -> None:
    """Issue 23: an alert on a failure kind or on fallbacks sees zeros, not "no data"."""
    registry = Metrics.create().registry
    for kind in STORE_FAILURE_KINDS:
        name = "compaction_proxy_store_failures_total"
        assert registry.get_sample_value(name, {"kind": kind}) == 0
    for operation in FALLBACK_OPERATIONS:
        name = "compaction_proxy_store_fallbacks_total"
        assert registry.get_sample_value(name, {"operation": operation}) == 0
    assert registry.get_sample_value("compaction_proxy_store_degraded") == 0
    labels = {"operation": "probe"}
    assert registry.get_sample_value("compaction_proxy_store_errors_total", labels) == 0


def _samples(metrics: Metrics) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        # When each was made, and the process's own readings: differ by design.
        if not s.name.endswith("_created") and not s.name.startswith("process_")
    }


@pytest.mark.parametrize("plain", [True, False])
def test_the_recorders_fast_observe_matches_prometheus_clients_own(
    plain: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request's series are observed through prometheus-client's internals
    (proxy.observe.recorder): the same sums and buckets as its public API, bounds included,
    on plain values (tally.py) or on those it leaves as they are (multiprocess mode's)."""
    if not plain:
        monkeypatch.setattr(recorder_module, "plain_child", lambda c, a="_value": getattr(c, a))
        monkeypatch.setattr(recorder_module, "plain_buckets", lambda child: child._buckets)
    ours, theirs = Metrics.create(), Metrics.create()
    fast = _FastHistogram(ours.added_latency.labels(route="chat"))
    assert fast.observe.__name__ == ("_observe_plain" if plain else "_observe")
    public = theirs.added_latency.labels(route="chat")
    for amount in (0.0, 0.0004, 0.0005, 0.0007, 0.001, 0.0011, 2.5, 30.0, 31.0, 1e9):
        fast.observe(amount)
        public.observe(amount)
    fast_count = _fast_counter(ours.input_tokens.labels(stage="before"))
    for tokens in (0, 1, 2082):
        fast_count.inc(tokens)
        theirs.input_tokens.labels(stage="before").inc(tokens)
    _fast_counter(ours.requests.labels(status="snapshot")).inc(1)
    theirs.requests.labels(status="snapshot").inc()
    assert _samples(ours) == _samples(theirs)
    assert _samples(ours) != _samples(Metrics.create())


def test_a_scrape_after_n_requests_shows_exactly_n() -> None:
    """The recorder's series hold plain numbers (proxy.observe.tally): counted as many
    times as requests finished, with what was counted before it took them over and
    what the public API counts after, in the exposition as prometheus-client writes it."""
    metrics = Metrics.create()
    public = metrics.responses.labels(route="chat", status="2xx")
    public.inc()  # before the recorder takes the series over
    recorder = Recorder(metrics, Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    requests = 1000
    for i in range(requests):
        rec = Record(f"req-{i}", perf_counter(), "POST", "/v1/chat/completions", route="chat")
        rec.status, rec.upstream_status, rec.upstream_s = 200, 200, 0.001
        recorder.in_flight.inc(1)
        recorder.in_flight.inc(-1)
        recorder.finish(rec)
    public.inc(2)  # and after
    lines = set(metrics.exposition().decode().splitlines())
    chat = '{route="chat"}'
    assert (
        f'compaction_proxy_responses_total{{route="chat",status="2xx"}} {requests + 3}.0' in lines
    )
    assert f"compaction_proxy_request_duration_seconds_count{chat} {requests}.0" in lines
    assert f"compaction_proxy_upstream_duration_seconds_count{chat} {requests}.0" in lines
    le = 'le="+Inf",route="chat"'
    assert f"compaction_proxy_added_latency_seconds_bucket{{{le}}} {requests}.0" in lines
    upstream = '{route="chat",status="2xx"}'
    assert f"compaction_proxy_upstream_responses_total{upstream} {requests}.0" in lines
    assert "compaction_proxy_requests_in_flight 0.0" in lines


def test_requests_of_more_kinds_than_the_recorder_keeps_are_all_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recorder keeps each (route, status, upstream status)'s series for the next
    request, up to a bound (upstreams answer any status): past it, still counted."""
    monkeypatch.setattr(recorder_module, "_SERIES_KEPT", 3)
    metrics = Metrics.create()
    recorder = Recorder(metrics, Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    upstream_statuses = [None, 200, 0, 429, 503, 504, 200, 429, None]
    for upstream_status in upstream_statuses:
        rec = Record("r", perf_counter(), "POST", "/v1/chat/completions", route="chat")
        rec.status, rec.upstream_status = 200, upstream_status
        recorder.finish(rec)
    assert len(recorder._series) == 3
    lines = set(metrics.exposition().decode().splitlines())
    total = len(upstream_statuses)
    assert f'compaction_proxy_responses_total{{route="chat",status="2xx"}} {total}.0' in lines
    called = [s for s in upstream_statuses if s is not None]
    assert (
        f'compaction_proxy_upstream_duration_seconds_count{{route="chat"}} {len(called)}.0' in lines
    )
    for label, count in (("2xx", 2), ("none", 1), ("429", 2), ("5xx", 2)):
        sample = f'compaction_proxy_upstream_responses_total{{route="chat",status="{label}"}}'
        assert f"{sample} {count}.0" in lines
