"""The series of Responses ``item_reference`` inputs (issue 24): how many the proxy read
as the output items it relayed, and how many it could not (priced conservatively,
``tokens.UNSEEN_ITEM_TOKENS`` each, and named as unseen in the summarizer's transcript).
Registered on the app's ``Metrics.registry`` when the services are built."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

REFERENCE_OUTCOMES = ("resolved", "unresolved")


class ReferenceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.references = Counter(
            "compaction_proxy_item_references",
            "Responses item_reference inputs in compacted requests, by outcome (resolved: "
            "read as the output item the proxy relayed; unresolved: not held, counted at "
            "512 tokens each)",
            ["outcome"],
            registry=registry,
        )
        for outcome in REFERENCE_OUTCOMES:
            self.references.labels(outcome=outcome)

    def observe(self, total: int, unresolved: int) -> None:
        if total:
            self.references.labels(outcome="resolved").inc(total - unresolved)
        if unresolved:
            self.references.labels(outcome="unresolved").inc(unresolved)
