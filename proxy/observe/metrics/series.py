"""What the metrics' series are: their label sets and buckets, all closed.

No label value comes from a client or an upstream unbounded: routes are the app's
route names, statuses a closed set (``status_label``: classes, with 429 and 499
apart), models the configured entry a name resolves to, or ``other``
(``ModelGauge``). Durations are histograms by route only (each label set of one is
some twenty series); statuses are counted by counters. ``_created`` series are not
exported (``Metrics.create``): one more per counter and histogram child, which no
dashboard reads. So ``/metrics`` stays a few hundred series whatever clients and
upstreams send (tests/e2e/test_bounds_e2e.py).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Gauge

# A whole request or upstream call: model answers take from milliseconds to minutes.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
# What the proxy adds: sub-millisecond forwarding, up to a summary's seconds.
ADDED_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TTFB_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80)
SUMMARY_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 120)
# Summarizer calls per summary: at most compaction.max_summary_calls (16 by default).
CALLS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# Redis calls time out after 250 ms.
STORE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)

# Closed label sets, declared at start-up (metrics/__init__.py).
STORE_OPERATIONS = (
    "load",
    "save",
    "delete",
    "acquire",
    "release",
    "load_window",
    "save_window",
    "list_sessions",
    "note_seen",
    "load_seen",
    "remember_items",
    "recall_items",
    "archive",
    "load_archive",
    "probe",  # the readiness write (every primary of a cluster): store/resilient.py
)
# What a failed store operation met (store/failures.py): a redirect to another cluster
# node, a read-only replica, a full Redis (maxmemory, noeviction), a cross-slot call, an
# ACL refusal, bad credentials, a dataset still loading, a cluster without a quorum, no
# answer in time, no connection (or none free in the pool), anything else.
STORE_FAILURE_KINDS = (
    "moved",
    "readonly",
    "oom",
    "crossslot",
    "noperm",
    "auth",
    "loading",
    "cluster_down",
    "timeout",
    "connection",
    "pool",
    "other",
)
TRIGGERS = ("threshold", "forced", "overflow_recovery", "scheduled", "precompact")
CHAT_STATUSES = ("passthrough", "snapshot", "compacted", "trimmed", "bypassed", "shadow")
DEGRADED_REASONS = (  # outcome.Degraded
    *("summary_failed", "summary_late", "backoff"),
    *("summaries_per_hour", "summarizer_tokens_per_day"),
    *("summary_deadline", "summary_slow", "summary_busy"),
)
PRECOMPACTION_OUTCOMES = (
    "compacted",
    "covered",
    "unchanged",
    "failed",
    "cancelled",
    "skipped_running",
    "skipped_backoff",
    "skipped_cap",
    "skipped_locked",
    "skipped_tenant_cap",
    "preempted",
    "yielded",
)

# HTTP statuses as labels: their class, and the two an operator tells apart from the
# rest of theirs (the upstream's rate limit; 499, the client left). Anything else an
# upstream may answer (any three digits) is its class, or "other": a closed set.
_STATUS_CODES = {429: "429", 499: "499"}
_STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


def status_label(status: int) -> str:
    """``status`` as a label of a closed set: 0 (no answer) is ``none``."""
    if not status:
        return "none"
    return _STATUS_CODES.get(status) or _STATUS_CLASSES.get(status // 100, "other")


class ModelGauge:
    """A gauge by model whose label is the configured model entry (its ``match``) a
    name resolves to, or ``other``: never the client's own model name."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        # Set once the model table exists (services.py); until then every name is other.
        self.entry_of: Callable[[str], str] = lambda _: "other"

    def labels(self, *, model: str) -> Gauge:
        return self.gauge.labels(model=self.entry_of(model))
