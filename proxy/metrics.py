"""Prometheus metrics, on a registry of the app's own (several apps per test process).

With several worker processes (``server.workers``), each worker calls
``enable_multiprocess(directory)`` before building its app: its metrics then
live in files there, and ``/metrics``, whichever worker serves it, shows the
sum over every worker (prometheus-client's multiprocess mode). Gauges need a
``multiprocess_mode`` saying how workers' values combine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "enable_multiprocess"]


class _Multiprocess:
    directory: str | None = None  # set once per worker process, before any metric exists


def enable_multiprocess(directory: str) -> None:
    """Make this process's metrics, from now on, shared through ``directory``."""
    # prometheus-client picks its value class when first imported, from the
    # environment; a worker sets both explicitly. The files are named from the
    # environment variable, so it is set too.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]  # untyped
    _Multiprocess.directory = directory


@dataclass(slots=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    compactions: Counter
    overflows: Counter
    summary_failures: Counter
    store_errors: Counter
    learned_window: Gauge
    learned_windows: Counter
    client_disconnects: Counter
    summaries_truncated: Counter
    summary_length_retries: Counter
    identifiers_restored: Counter
    snapshots_unreadable: Counter
    lock_release_retries: Counter
    # Background pre-compaction (precompact.py).
    compactions_by_trigger: Counter
    precompactions: Counter
    precompactions_running: Gauge
    summary_waits: Counter
    requests_cut_at_shutdown: Counter

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry(auto_describe=True)
        return cls(
            registry=r,
            requests=Counter(
                "compaction_proxy_chat_requests",
                "Chat completion requests by X-Compaction-Status",
                ["status"],
                registry=r,
            ),
            compactions=Counter(
                "compaction_proxy_compactions",
                "Compactions by outcome (compacted, trimmed); a background one (pre-compaction) "
                "counts only when it compacted",
                ["outcome"],
                registry=r,
            ),
            overflows=Counter(
                "compaction_proxy_upstream_overflows",
                "Upstream context-overflow answers by error format and recovery outcome",
                ["provider", "kind", "outcome"],
                registry=r,
            ),
            summary_failures=Counter(
                "compaction_proxy_summary_failures",
                "Summarizations that failed or timed out (the turn was trimmed instead)",
                registry=r,
            ),
            store_errors=Counter(
                "compaction_proxy_store_errors",
                "Snapshot store calls that failed (served without the store)",
                ["operation"],
                registry=r,
            ),
            learned_window=Gauge(
                "compaction_proxy_learned_window_tokens",
                "Context windows learned from upstream overflow errors, shared by all callers",
                ["model"],
                registry=r,
                # Across workers: the window each last learned (the same one, with Redis).
                multiprocess_mode="livemostrecent",
            ),
            summaries_truncated=Counter(
                "compaction_proxy_summaries_truncated",
                "Summaries still cut off by their token limit after a terser retry (the "
                "previous snapshot was kept and the turn trimmed)",
                registry=r,
            ),
            summary_length_retries=Counter(
                "compaction_proxy_summary_length_retries",
                "Summarizer calls retried because the answer was cut off by its token limit",
                registry=r,
            ),
            identifiers_restored=Counter(
                "compaction_proxy_identifiers_restored",
                "Identifiers a new summary had lost, put back by the proxy's check",
                registry=r,
            ),
            client_disconnects=Counter(
                "compaction_proxy_client_disconnects",
                "Chat requests whose client went away before the answer, by phase "
                "(upstream: its upstream call was cancelled)",
                ["phase"],
                registry=r,
            ),
            learned_windows=Counter(
                "compaction_proxy_learned_windows",
                "Windows learned from overflow errors, by scope (tenant: one caller's own; "
                "shared: lowered for everyone once enough tenants agreed)",
                ["scope"],
                registry=r,
            ),
            snapshots_unreadable=Counter(
                "compaction_proxy_snapshots_unreadable",
                "Stored values that could not be read (bad data, another key or format) and "
                "were treated as absent, by kind (snapshot, window)",
                ["kind"],
                registry=r,
            ),
            lock_release_retries=Counter(
                "compaction_proxy_lock_release_retries",
                "Summarization locks whose release failed and was retried in the background, "
                "by outcome (released, expired, cancelled)",
                ["outcome"],
                registry=r,
            ),
            compactions_by_trigger=Counter(
                "compaction_proxy_compactions_by_trigger",
                "Compactions that wrote a new snapshot, by trigger (inline: in a request's "
                "path; background: pre-compaction after an answer)",
                ["trigger"],
                registry=r,
            ),
            precompactions=Counter(
                "compaction_proxy_precompactions",
                "Background pre-compactions by outcome (compacted; covered: a newer snapshot "
                "already did; unchanged: nothing to fold in; failed; cancelled; skipped_running, "
                "skipped_backoff, skipped_cap, skipped_locked)",
                ["outcome"],
                registry=r,
            ),
            precompactions_running=Gauge(
                "compaction_proxy_precompactions_running",
                "Background pre-compactions running now",
                multiprocess_mode="livesum",
                registry=r,
            ),
            summary_waits=Counter(
                "compaction_proxy_inline_summary_waits",
                "Chat requests that waited on a summary in their own path, by kind "
                "(summarized: called the summarizer; waited: for another request's summary)",
                ["kind"],
                registry=r,
            ),
            requests_cut_at_shutdown=Counter(
                "compaction_proxy_requests_cut_at_shutdown",
                "Requests (streams included) still running at the shutdown deadline "
                "(server.shutdown_timeout_s), ended unfinished",
                registry=r,
            ),
        )

    def exposition(self) -> bytes:
        directory = _Multiprocess.directory
        if directory is None:
            return generate_latest(self.registry)
        # Every worker's files, read at each scrape (dead workers' counters included).
        merged = CollectorRegistry(auto_describe=True)
        MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]  # untyped
        return generate_latest(merged)
