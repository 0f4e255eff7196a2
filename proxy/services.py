"""The long-lived objects a request needs, built once per app by ``build_services``."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.compaction.compact import Compactor
from proxy.compaction.inflight import BodyBudget
from proxy.compaction.precompact import Precompactor
from proxy.compaction.schedule import Schedule
from proxy.compaction.sightings import SessionSightings
from proxy.config import Settings
from proxy.core.models import ModelTable
from proxy.core.tokens import TokenCounter
from proxy.observe.metrics import Metrics
from proxy.store import Store
from proxy.upstream.calibrate import Calibration
from proxy.upstream.client import Upstream
from proxy.upstream.headers import HeaderPolicy
from proxy.upstream.windows import LearnedWindows


@dataclass(slots=True)
class Services:
    settings: Settings
    client: Upstream
    headers: HeaderPolicy
    models: ModelTable
    store: Store
    counters: dict[str, TokenCounter]  # by tokenizer name
    calibration: Calibration
    schedule: Schedule
    compactor: Compactor
    precompactor: Precompactor
    sightings: SessionSightings
    windows: LearnedWindows
    metrics: Metrics
    bodies: BodyBudget  # request bodies held by this process (server.max_inflight_body_bytes)

    async def aclose(self) -> None:
        """Close what ``build_services`` opened: background compactions (they use both),
        the store, then the upstream client."""
        try:
            await self.precompactor.aclose()
            await self.store.aclose()
        finally:
            await self.client.aclose()
