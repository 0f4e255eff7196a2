"""Where models' figures came from, the upstream asked about them, and output ceilings
learned, as series. Labelled by source, outcome and scope only,
closed sets: never by the model's name, which the client chooses."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from proxy.core.models import SOURCES


@dataclass(frozen=True, slots=True)
class ModelSeries:
    resolved: Counter
    defaulted: Counter
    learned_outputs: Counter
    clamped: Counter
    discoveries: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ModelSeries:
        series = cls(
            resolved=Counter(
                "compaction_proxy_models_resolved",
                "Model names resolved (each once while remembered), by where their window "
                "came from (config: a models: entry; provider: the upstream's own listing, per "
                "credential scope; registry: the model registry package; default: "
                "default_model, the name known to none)",
                ["source"],
                registry=registry,
            ),
            defaulted=Counter(
                "compaction_proxy_default_model_requests",
                "Requests whose model no models: entry and no registry knows: planned "
                "against default_model's window",
                registry=registry,
            ),
            learned_outputs=Counter(
                "compaction_proxy_learned_output_limits",
                "Output limits learned from upstream output-budget errors, by scope (tenant: "
                "one caller's; shared: everyone's, once agreed)",
                ["scope"],
                registry=registry,
            ),
            clamped=Counter(
                "compaction_proxy_output_clamped_requests",
                "Requests whose output budget was lowered to a learned output limit before "
                "they were sent",
                registry=registry,
            ),
            discoveries=Counter(
                "compaction_proxy_model_discoveries",
                "Times the upstream was asked what it says of its models (upstream/discovery.py)"
                ", by outcome (described: a window for at least one model; silent: it answered"
                " without one; failed: no usable answer in time)",
                ["outcome"],
                registry=registry,
            ),
        )
        for source in SOURCES:
            series.resolved.labels(source=source)
        for scope in ("tenant", "shared"):
            series.learned_outputs.labels(scope=scope)
        for outcome in ("described", "silent", "failed"):
            series.discoveries.labels(outcome=outcome)
        return series
