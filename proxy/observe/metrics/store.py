"""The shared store's health as series: what failed, by operation and
by kind; what was served from local state instead; whether the store is failing now.
``store/health.py`` moves them."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.observe.metrics.series import STORE_FAILURE_KINDS, STORE_OPERATIONS

# Operations a request makes: a probe is never served from local state.
FALLBACK_OPERATIONS = tuple(op for op in STORE_OPERATIONS if op != "probe")


@dataclass(frozen=True, slots=True)
class StoreSeries:
    errors: Counter
    failures: Counter
    fallbacks: Counter
    degraded: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> StoreSeries:
        series = cls(
            errors=Counter(
                "compaction_proxy_store_errors",
                "Snapshot store calls that failed (served without the store)",
                ["operation"],
                registry=registry,
            ),
            failures=Counter(
                "compaction_proxy_store_failures",
                "Failed calls to the shared store, every one, by kind (moved, readonly, oom, "
                "crossslot, noperm, auth, loading, cluster_down, timeout, connection, pool, "
                "other); the same calls as store_errors_total, which is by operation",
                ["kind"],
                registry=registry,
            ),
            fallbacks=Counter(
                "compaction_proxy_store_fallbacks",
                "Store operations served from this replica's local state instead of the "
                "shared store (it failed, or was skipped in the cool-down after a failure)",
                ["operation"],
                registry=registry,
            ),
            degraded=Gauge(
                "compaction_proxy_store_degraded",
                "1 while the shared store is seen failing: from a failed call until a write "
                "succeeds again (/readyz says why)",
                registry=registry,
                multiprocess_mode="livemax",  # across workers: failing if any one sees it
            ),
        )
        for operation in STORE_OPERATIONS:
            series.errors.labels(operation=operation)
        for kind in STORE_FAILURE_KINDS:
            series.failures.labels(kind=kind)
        for operation in FALLBACK_OPERATIONS:
            series.fallbacks.labels(operation=operation)
        return series
