"""Issue 10 end to end: each metric and label the chart's dashboard queries is a series a
live proxy exports after traffic, with the labels it carries. Taking the expressions
apart: tests/observe/test_dashboard.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.metrics import Metrics
from proxy.store.memory import MemoryStore
from proxy.store.resilient import ResilientStore
from tests.support.dashboard import dashboard, expressions, referenced
from tests.support.docs import page
from tests.support.metrics import client, long_history
from tests.support.servers import proxy_settings

# Labels Prometheus adds when it scrapes, not the proxy.
TARGET_LABELS = frozenset({"job", "instance"})


# What the issue asks the dashboard to show, by the series that show it.
REQUIRED = frozenset(
    {
        "compaction_proxy_request_duration_seconds_count",
        "compaction_proxy_responses_total",
        "compaction_proxy_upstream_responses_total",
        "compaction_proxy_added_latency_seconds_bucket",
        "compaction_proxy_stream_ttfb_seconds_bucket",
        "compaction_proxy_active_streams",
        "compaction_proxy_compactions_total",
        "compaction_proxy_input_tokens_total",
        "compaction_proxy_summarization_duration_seconds_bucket",
        "compaction_proxy_upstream_overflows_total",
        "compaction_proxy_learned_windows_total",
        "compaction_proxy_store_errors_total",
        "compaction_proxy_store_failures_total",
        "compaction_proxy_store_fallbacks_total",
        "compaction_proxy_store_degraded",
        "compaction_proxy_store_duration_seconds_bucket",
        "compaction_proxy_requests_in_flight",
        "compaction_proxy_worker_restarts_total",
        "compaction_proxy_build_info",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    }
)


def exported(url: str) -> dict[str, set[str]]:
    """Every series name /metrics exports, with the labels its samples carry."""
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def traffic(url: str) -> None:
    """A compaction, a stream, an overflow recovery that teaches a shared window, a
    passthrough call: every kind of event the dashboard shows."""
    sdk = client(url)
    compacted = sdk.chat.completions.with_raw_response.create(
        model="sim-small", messages=long_history(50), extra_headers={"X-Session-Id": "board"}
    )
    assert compacted.headers["x-compaction-status"] == "compacted"
    stream = sdk.chat.completions.create(
        model="sim-small", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with stream:
        assert sum(1 for _ in stream) > 1
    recovered = sdk.chat.completions.with_raw_response.create(
        model="sim-big",
        messages=long_history(50),
        extra_headers={"X-Session-Id": "recovered", "X-Sim-Context-Window": "3000"},
    )
    assert recovered.headers["x-compaction-status"] == "compacted"
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk"}).is_success


@pytest.fixture
def scraped(sim_reset: str, start_proxy: Callable[..., str]) -> dict[str, set[str]]:
    settings = proxy_settings(
        sim_reset,
        models=[
            {"match": "sim-small", "context_window": 4096, "max_output_tokens": 256},
            {"match": "sim-big", "context_window": 32768, "max_output_tokens": 256},
        ],
        compaction={"summary_max_tokens": 400, "learned_window_quorum": 1},
    )
    url = start_proxy(settings)
    traffic(url)
    # A memory:// store has no calls to time: a Redis store declares these when built
    # (tests/observe/test_metrics.py holds that), with the labels of a fresh one's.
    redis_only = _samples_of(ResilientStore(MemoryStore(60), MemoryStore(60), Metrics.create()))
    return {**exported(url), **redis_only}


def _samples_of(store: ResilientStore) -> dict[str, set[str]]:
    series: dict[str, set[str]] = {}
    for family in store._metrics.registry.collect():
        for sample in family.samples:
            if sample.name.startswith("compaction_proxy_store_duration_seconds"):
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


def documented_alerts() -> list[str]:
    """The PromQL of the alerts table (docs/kubernetes.md, "Alerts")."""
    text = page("kubernetes.md")
    table = text[text.index("**Alerts**") :].split("\n## ", 1)[0]
    return re.findall(r"^\| [^|]+ \| `([^`]+)`", table, re.MULTILINE)


# What Prometheus itself records for every target it scrapes (the down alerts' series),
# with the target labels it attaches.
SCRAPE_SERIES = {"up": {"job", "instance"}}


def test_every_series_the_dashboard_queries_is_exported(scraped: dict[str, set[str]]) -> None:
    """And every series the alerts the docs recommend query (or Prometheus records)."""
    alerts = documented_alerts()
    assert len(alerts) >= 5
    known = {**scraped, **SCRAPE_SERIES}
    for expr in alerts:
        names, labels = referenced(expr)
        assert names, expr
        assert not names - known.keys(), f"docs alert {expr!r}"
        assert labels <= set().union(*(known[name] for name in names)), expr
    used: set[str] = set()
    for expr in expressions(dashboard()):
        names, labels = referenced(expr)
        assert names, f"no metric in {expr!r}"
        missing = names - scraped.keys()
        assert not missing, f"{expr!r} queries {missing}, which the proxy does not export"
        carried = set().union(*(scraped[name] for name in names)) | TARGET_LABELS
        assert labels <= carried, f"{expr!r} uses labels {labels - carried} its series lack"
        used |= names
    assert not REQUIRED - used, f"the dashboard does not show {REQUIRED - used}"
