"""Prometheus metrics, on a registry of the app's own (several apps per test process):
``Metrics``, the one face every part of the proxy counts through, and beside it the
series of each concern, declared in a room of their own and reached through the face:

    series.py       label sets and buckets, all closed, whatever clients send
    store.py        the shared store's health          models.py   where figures came from
    archive.py      the archive, recall by excerpts    recall_tool.py   the recall tool
    shadow.py       what shadow mode would have done   regret.py   tool calls repeated
    tenants.py      per-tenant policy                  logs.py     lines not formatted
    process.py      process_*, build info, in flight   exposition.py   ``/metrics``

Series whose labels are a closed set are declared at start-up (``__post_init__``), so
dashboards and alerts see zeros rather than no data before the first event. A request's
own series are observed in one place, ``recorder.Recorder.finish``. With several workers,
``/metrics`` sums them (exposition.py); gauges say how (``multiprocess_mode``)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from proxy.core.summary_check import REASONS as REJECTIONS
from proxy.observe.metrics.archive import ArchiveSeries
from proxy.observe.metrics.exposition import CONTENT_TYPE_LATEST, enable_multiprocess, exposition
from proxy.observe.metrics.logs import count_unformatted_lines
from proxy.observe.metrics.models import ModelSeries
from proxy.observe.metrics.process import ProcessSeries
from proxy.observe.metrics.references import ReferenceMetrics
from proxy.observe.metrics.series import (
    ADDED_BUCKETS,
    CALL_BUCKETS,
    CALLS_BUCKETS,
    CHAT_STATUSES,
    DEGRADED_REASONS,
    PRECOMPACTION_OUTCOMES,
    STORE_BUCKETS,
    SUMMARY_BUCKETS,
    TRIGGERS,
    TTFB_BUCKETS,
    ModelGauge,
)
from proxy.observe.metrics.store import StoreSeries
from proxy.observe.metrics.tenants import TenantSeries

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "enable_multiprocess"]


@dataclass(slots=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    compactions: Counter
    overflows: Counter
    summary_failures: Counter
    store: StoreSeries  # the shared store's health: errors, fallbacks, degraded
    archive: ArchiveSeries  # the archive of originals, recall by excerpts
    models: ModelSeries  # where windows came from; output limits learned and applied
    learned_window: ModelGauge
    learned_windows: Counter
    client_disconnects: Counter
    summaries_truncated: Counter
    summary_length_retries: Counter
    summaries_rejected: Counter
    identifiers_restored: Counter
    snapshots_unreadable: Counter
    lock_release_retries: Counter
    request_duration: Histogram
    upstream_duration: Histogram
    responses: Counter
    upstream_responses: Counter
    added_latency: Histogram
    stream_ttfb: Histogram
    active_streams: Gauge
    input_tokens: Counter
    summarization_duration: Histogram
    summarizer_calls: Histogram
    store_duration: Histogram
    compactions_by_trigger: Counter  # this and the next three: precompact.py
    precompactions: Counter
    precompactions_running: Gauge
    summary_waits: Counter
    requests_cut_at_shutdown: Counter
    degraded_requests: Counter
    failed_summary_seconds: Counter
    sent_during_summary: Counter
    slot_misses: Counter
    slot_warmups: Counter
    process: ProcessSeries  # process_*, build info, requests in flight: process.py
    tenants: TenantSeries  # per-tenant policy: caps hit, config reloads
    references: ReferenceMetrics  # Responses item_reference inputs, read or not
    unformatted_lines: Counter  # the process's log writer counts there (logs.py)

    @classmethod
    def create(cls) -> Metrics:
        # prometheus-client's switch is per process; every registry of ours wants it.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        r = CollectorRegistry(auto_describe=True)
        return cls(
            registry=r,
            process=ProcessSeries.create(r),
            tenants=TenantSeries(r),
            references=ReferenceMetrics(r),
            unformatted_lines=count_unformatted_lines(r),
            requests=Counter(
                "compaction_proxy_chat_requests",
                "Chat completion requests by X-Compaction-Status",
                ["status"],
                registry=r,
            ),
            compactions=Counter(
                "compaction_proxy_compactions",
                "Compactions by trigger (threshold, forced, overflow_recovery, scheduled; "
                "precompact: in the background after an answer, counted only when it "
                "compacted) and outcome (compacted; trimmed: the summary failed; failed: it "
                "failed, the view fit; backoff: not asked, its summaries failed or plans saved "
                "nothing; nothing_to_save; snapshot: another's; too_slow, dropped: the deadline)",
                ["trigger", "outcome"],
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
            store=StoreSeries.create(r),
            archive=ArchiveSeries.create(r),
            models=ModelSeries.create(r),
            learned_window=ModelGauge(
                Gauge(
                    "compaction_proxy_learned_window_tokens",
                    "Context windows learned from upstream overflow errors, shared by all "
                    "callers, by configured model entry (its match; other: none matched)",
                    ["model"],
                    registry=r,
                    # Across workers: the window each last learned (the same one, with Redis).
                    multiprocess_mode="livemostrecent",
                )
            ),
            summaries_truncated=Counter(
                "compaction_proxy_summaries_truncated",
                "Summaries cut off after a terser retry too (old snapshot kept, turn trimmed)",
                registry=r,
            ),
            summary_length_retries=Counter(
                "compaction_proxy_summary_length_retries",
                "Summarizer calls retried because the answer was cut off by its token limit",
                registry=r,
            ),
            summaries_rejected=Counter(
                "compaction_proxy_summaries_rejected",
                "Summarizer answers not kept, by reason (summary_check.py; truncated: cut off)",
                ["reason"],
                registry=r,
            ),
            identifiers_restored=Counter(
                "compaction_proxy_identifiers_restored",
                "Identifiers a new summary had lost, put back by the proxy's check",
                registry=r,
            ),
            client_disconnects=Counter(
                "compaction_proxy_client_disconnects",
                "Chat requests whose client left before the answer, by phase (upstream: cancelled)",
                ["phase"],
                registry=r,
            ),
            learned_windows=Counter(
                "compaction_proxy_learned_windows",
                "Learned windows by scope (tenant: one caller's; shared: everyone's, once agreed)",
                ["scope"],
                registry=r,
            ),
            snapshots_unreadable=Counter(
                "compaction_proxy_snapshots_unreadable",
                "Stored values unreadable (bad data, other key or format) taken as absent, by kind",
                ["kind"],
                registry=r,
            ),
            lock_release_retries=Counter(
                "compaction_proxy_lock_release_retries",
                "Lock releases that failed and were retried in the background, by outcome",
                ["outcome"],
                registry=r,
            ),
            request_duration=Histogram(
                "compaction_proxy_request_duration_seconds",
                "Requests from arrival to their last byte sent (or the client leaving), by route",
                ["route"],
                buckets=CALL_BUCKETS,
                registry=r,
            ),
            upstream_duration=Histogram(
                "compaction_proxy_upstream_duration_seconds",
                "A request's upstream calls, from sending to the last byte of the answer, by route",
                ["route"],
                buckets=CALL_BUCKETS,
                registry=r,
            ),
            responses=Counter(
                "compaction_proxy_responses",
                "Responses by route and HTTP status class (2xx...; 429 and 499 apart)",
                ["route", "status"],
                registry=r,
            ),
            upstream_responses=Counter(
                "compaction_proxy_upstream_responses",
                "Requests by route and their last upstream answer's status class (429 apart; none)",
                ["route", "status"],
                registry=r,
            ),
            added_latency=Histogram(
                "compaction_proxy_added_latency_seconds",
                "Per forwarded request, its duration less its upstream time: what the proxy "
                "added (parsing, counting, the store, summaries, relaying), by route",
                ["route"],
                buckets=ADDED_BUCKETS,
                registry=r,
            ),
            stream_ttfb=Histogram(
                "compaction_proxy_stream_ttfb_seconds",
                "Event streams: arrival to the first byte sent to the client, by route",
                ["route"],
                buckets=TTFB_BUCKETS,
                registry=r,
            ),
            active_streams=Gauge(
                "compaction_proxy_active_streams",
                "Event streams being relayed to clients now",
                registry=r,
                multiprocess_mode="livesum",
            ),
            input_tokens=Counter(
                "compaction_proxy_input_tokens",
                "Chat input tokens by stage: before (as the client sent them), after (as sent "
                "upstream); estimates for requests not counted",
                ["stage"],
                registry=r,
            ),
            summarization_duration=Histogram(
                "compaction_proxy_summarization_duration_seconds",
                "Summaries asked of the upstream, every chunk and retry included, by outcome",
                ["outcome"],
                buckets=SUMMARY_BUCKETS,
                registry=r,
            ),
            summarizer_calls=Histogram(
                "compaction_proxy_summarizer_calls_per_compaction",
                "Summarizer calls one new summary took, every chunk and retry included",
                buckets=CALLS_BUCKETS,
                registry=r,
            ),
            store_duration=Histogram(
                "compaction_proxy_store_duration_seconds",
                "Calls to the shared (Redis) store, failed ones included, by operation",
                ["operation"],
                buckets=STORE_BUCKETS,
                registry=r,
            ),
            compactions_by_trigger=Counter(
                "compaction_proxy_compactions_by_trigger",
                "Snapshots written by compactions, by trigger (inline; background: precompact)",
                ["trigger"],
                registry=r,
            ),
            precompactions=Counter(
                "compaction_proxy_precompactions",
                "Background pre-compactions by outcome (compacted; covered: a newer snapshot did;"
                " unchanged: nothing to fold; failed; cancelled; preempted: for a tenant under its"
                " share; yielded: to a turn on one slot; skipped_*: running, backoff, cap, locked)",
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
                "Requests still running at the shutdown deadline (server.shutdown_timeout_s), cut",
                registry=r,
            ),
            degraded_requests=Counter(
                "compaction_proxy_degraded_requests",
                "Chat requests due a summary and served without one (X-Compaction-Degraded), "
                "by reason (summary_failed: theirs or the one they waited for; summary_late: "
                "that one outlived the wait; backoff: none asked; summary_deadline|slow|busy)",
                ["reason"],
                registry=r,
            ),
            failed_summary_seconds=Counter(
                "compaction_proxy_failed_summary_seconds",
                "Seconds chat requests spent in failed summaries (theirs, or waiting on another's)",
                registry=r,
            ),
            sent_during_summary=Counter(
                "compaction_proxy_turns_sent_during_summary",
                "Chat requests sent upstream while a background summary on the same model ran",
                registry=r,
            ),
            slot_misses=Counter(
                "compaction_proxy_session_slot_misses",
                "Histories that started with none of their session's snapshots (slots), by outcome "
                "(side: read another's; free: a free one; moved: its own; evicted: stalest)",
                ["outcome"],
                registry=r,
            ),
            slot_warmups=Counter(
                "compaction_proxy_slot_warmups",
                "A single-slot server's cache given a background compaction's view (warmed;"
                " gave_way: to a turn; failed; unsupported: the API has no such request)",
                ["outcome"],
                registry=r,
            ),
        )

    def __post_init__(self) -> None:
        for trigger in TRIGGERS:
            for outcome in ("compacted", "trimmed", "failed", "nothing_to_save"):
                self.compactions.labels(trigger=trigger, outcome=outcome)
        # store_duration's (14 series each) come with the Redis store that times its calls.
        closed: tuple[tuple[Counter | Histogram, str, tuple[str, ...]], ...] = (
            (self.requests, "status", CHAT_STATUSES),
            (self.input_tokens, "stage", ("before", "after")),
            (self.summarization_duration, "outcome", ("ok", "failed")),
            (self.learned_windows, "scope", ("tenant", "shared")),
            (self.snapshots_unreadable, "kind", ("snapshot", "window")),
            (self.lock_release_retries, "outcome", ("released", "expired", "cancelled", "gave_up")),
            (self.client_disconnects, "phase", ("upstream",)),
            (self.precompactions, "outcome", PRECOMPACTION_OUTCOMES),
            (self.compactions_by_trigger, "trigger", ("inline", "background")),
            (self.summary_waits, "kind", ("summarized", "waited")),
            (self.summaries_rejected, "reason", REJECTIONS),
            (self.degraded_requests, "reason", DEGRADED_REASONS),
            (self.slot_misses, "outcome", ("side", "free", "moved", "evicted")),
            (self.slot_warmups, "outcome", ("warmed", "gave_way", "failed", "unsupported")),
        )
        for metric, label, values in closed:
            for value in values:
                metric.labels(**{label: value})

    def exposition(self) -> bytes:
        return exposition(self.registry)
