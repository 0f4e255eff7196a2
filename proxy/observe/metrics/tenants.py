"""Per-tenant policy's series (tenants.py, compaction/caps.py, serve/reload.py), on
``Metrics.registry``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

CAP_REASONS = ("summaries_per_hour", "summarizer_tokens_per_day")
RELOAD_OUTCOMES = ("applied", "unchanged", "invalid")


class TenantSeries:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.capped = Counter(
            "compaction_proxy_tenant_capped",
            "Summaries not asked for because the tenant's policy was over a cap, by the "
            "cap (the turn trimmed instead, or the background run skipped)",
            ["reason"],
            registry=registry,
        )
        self.cap_errors = Counter(
            "compaction_proxy_tenant_cap_errors",
            "Cap counts the store failed to read or write (the summary went ahead)",
            registry=registry,
        )
        self.reloads = Counter(
            "compaction_proxy_config_reloads",
            "Config file re-reads (file change or SIGHUP), per process, by outcome: applied "
            "(a new tenants policy), unchanged, invalid (the old policy kept)",
            ["outcome"],
            registry=registry,
        )
        for reason in CAP_REASONS:
            self.capped.labels(reason=reason)
        for outcome in RELOAD_OUTCOMES:
            self.reloads.labels(outcome=outcome)
