"""Shadow mode's series (compaction/shadow.py), on ``Metrics.registry`` beside the
ledger's: what the proxy would have done with each request it
forwarded untouched, counted when the request ends (``Ledger.finish``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from proxy.core.outcome import Shadow

SHADOW_STATUSES = ("passthrough", "snapshot", "compacted", "trimmed", "failed")
SHADOW_KINDS = ("history", "would_send", "summarizer_input", "summarizer_output")


class ShadowSeries:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "compaction_proxy_shadow_requests",
            "Requests forwarded untouched in shadow mode, by what their view would have "
            "been: compacted (a compaction it would make now), snapshot (an earlier one "
            "applied), trimmed, passthrough, failed (a shadow summary failed)",
            ["status"],
            registry=registry,
        )
        self.tokens = Counter(
            "compaction_proxy_shadow_tokens",
            "Shadow mode's input tokens, the proxy's counts, by kind: history (as sent, "
            "forwarded), would_send (what it would have sent instead), summarizer_input, "
            "summarizer_output (its compactions'); estimated net saved = history - "
            "would_send - summarizer_*",
            ["kind"],
            registry=registry,
        )
        for status in SHADOW_STATUSES:
            self.requests.labels(status=status)
        for kind in SHADOW_KINDS:
            self.tokens.labels(kind=kind)

    def observe(self, shadow: Shadow) -> None:
        self.requests.labels(status=shadow.status).inc()
        given, written = shadow.summarizer
        figures = (shadow.history, shadow.tokens, given, written)
        for kind, amount in zip(SHADOW_KINDS, figures, strict=True):
            if amount > 0:
                self.tokens.labels(kind=kind).inc(amount)
