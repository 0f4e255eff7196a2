"""The long-lived objects a request needs (``Services``), and the composition root that
builds them once per app: ``build_services(settings)``.

The app's lifespan and ``check-config`` both assemble through here, so what
``check-config`` validates (the model table, the tokenizers) is built exactly
as the server builds it.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial

from proxy.compaction.caps import TenantCaps
from proxy.compaction.compact import Compactor
from proxy.compaction.held import HeldCuts
from proxy.compaction.inflight import BodyBudget
from proxy.compaction.precompact import Precompactor
from proxy.compaction.recall import Recall
from proxy.compaction.recall_tool import RecallTool
from proxy.compaction.schedule import Schedule
from proxy.compaction.sightings import SessionSightings
from proxy.compaction.turn_deadline import TurnDeadline
from proxy.config import Settings
from proxy.core.encodings import Encoder, load_encoders
from proxy.core.models import ModelTable, ResolvedModel
from proxy.core.tenant_ids import TenantIds
from proxy.core.tokens import TokenCounter
from proxy.observe.ledger import Ledger
from proxy.observe.line import clipped
from proxy.observe.metrics import Metrics
from proxy.store import (
    ItemStore,
    Store,
    build_archive,
    build_item_store,
    build_store,
    refuse_cluster_node,
)
from proxy.store.quota import build_quota
from proxy.tenants import TenantPolicies
from proxy.upstream.calibrate import Calibration
from proxy.upstream.ceilings import LearnedCeilings
from proxy.upstream.client import UpstreamClient
from proxy.upstream.discovery import ModelDiscovery
from proxy.upstream.headers import HeaderPolicy
from proxy.upstream.output_items import ItemWrites
from proxy.upstream.registry import read_registry
from proxy.upstream.seam import Upstream
from proxy.upstream.windows import LearnedWindows, WindowPolicy

log = logging.getLogger("proxy.models")


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
    ceilings: LearnedCeilings  # output limits learned the same way (upstream/ceilings.py)
    metrics: Metrics
    bodies: BodyBudget  # request bodies held by this process (server.max_inflight_body_bytes)
    items: ItemStore  # output items relayed, for Responses item_reference inputs
    ledger: Ledger  # does compaction pay: per session and tenant (this process), and series
    policies: TenantPolicies  # `tenants:` in force, swapped by a reload (serve/reload.py)
    tenant_ids: TenantIds  # the tenant of a request, under this deployment's key
    recall: Recall  # excerpts of the archived originals (compaction/recall.py)
    recall_tool: RecallTool  # a search of them the model calls (compaction/recall_tool.py)
    held: HeldCuts = field(init=False)  # cache_aware's views served last
    # What the upstream says of its models (upstream/discovery.py); None: never asked.
    discovery: ModelDiscovery | None = None
    loop: asyncio.AbstractEventLoop | None = None  # the one it was built in and serves on
    deadline: TurnDeadline = field(init=False)  # inline summaries bounded (turn_deadline.py)

    def __post_init__(self) -> None:
        self.held = HeldCuts(self.compactor.memory)
        self.deadline = TurnDeadline(self.compactor, self.precompactor, self.compactor.folder.pace)

    def known_model(self, name: str, tenant: str) -> ResolvedModel | None:
        """``effective_model`` when the windows learned for it were read lately (nearly
        always): no store read, no coroutine. None: ask ``effective_model``."""
        model = self.resolved_model(name, tenant)
        if model.source == "default":
            self.metrics.models.defaulted.inc()
        return self.windows.known(self.calibration.apply(model, tenant), tenant)

    async def effective_model(self, name: str, tenant: str) -> ResolvedModel:
        """The model's spec with the one window every step and every response uses: the
        configured window in our token units for this tenant (calibration), or the
        smaller window learned from the upstream's overflow errors."""
        model = self.calibration.apply(self.resolved_model(name, tenant), tenant)
        return await self.windows.apply(model, tenant)

    def resolved_model(self, name: str, tenant: str) -> ResolvedModel:
        """``name``'s figures for ``tenant`` before anything learned: its ``models:``
        entry, else what the upstream says of it (asked in the background, the first
        time), else the registry's, else ``default_model``'s. An entry that leaves
        ``slots`` unset takes the upstream's count (llama.cpp's ``/props``)."""
        model = self.models.resolve(name)
        if self.discovery is None or (model.source == "config" and model.slots is not None):
            return model
        return self.discovery.described(model, tenant)

    async def aclose(self) -> None:
        """Close what ``build_services`` opened: background compactions (they use both),
        the store, then the upstream client."""
        try:
            if self.discovery is not None:
                await self.discovery.aclose()
            await self.precompactor.aclose()
            await self.recall.close()
            await self.store.aclose()
        finally:
            await self.client.aclose()


async def load_models(settings: Settings) -> tuple[ModelTable, dict[str, Encoder]]:
    """The model table, the model registry read into it, and one encoder per tokenizer it
    names (``ConfigError`` if unknown)."""
    models = ModelTable(settings, await asyncio.to_thread(read_registry))
    # A model family's tokenizer that no configured model names is loaded in case a
    # client asks for such a model; should it be approximated, that is said then.
    unnamed = models.tokenizers() - models.configured_tokenizers()
    # Tokenizer files load in a thread: seconds of CPU and disk, never on the loop.
    encoders = await asyncio.to_thread(
        partial(load_encoders, sorted(models.tokenizers()), quiet=unnamed)
    )
    models.announce_on_first_use({name: encoders[name] for name in unnamed})
    return models, encoders


def _note_resolved(metrics: Metrics, model: ResolvedModel) -> None:
    """Count where a newly resolved name's figures came from; warn of one known nowhere."""
    metrics.models.resolved.labels(source=model.source).inc()
    if model.source == "default":
        # %r: the name is the client's text (clipped: up to server.max_model_bytes); a
        # newline in it must not start a forged line.
        log.warning(
            "model %r is in no models: entry and not in the model registry: planned against "
            "default_model's window (%d tokens) until the upstream describes it, if it does",
            clipped(model.name),
            model.context_window,
        )


async def build_services(settings: Settings) -> Services:
    """Everything a request needs, with metrics of its own; the caller must ``aclose`` it.

    Must run inside the event loop that will serve (the upstream client binds to it).
    If building fails half-way, whatever was already opened is closed again.
    """
    metrics = Metrics.create()
    models, encoders = await load_models(settings)
    metrics.learned_window.entry_of = models.entry_of
    models.on_resolved = partial(_note_resolved, metrics)
    counters = {name: TokenCounter(enc) for name, enc in encoders.items()}
    async with AsyncExitStack() as opened:
        client = UpstreamClient(settings)
        opened.push_async_callback(client.aclose)
        store = build_store(settings, metrics)
        opened.push_async_callback(store.aclose)
        await refuse_cluster_node(settings.store.url)  # an app served without serve()
        tenant_ids = TenantIds.from_settings(settings)
        archive = build_archive(store)  # the originals snapshots replace, beside them
        recall = Recall(archive, metrics, settings.compaction, counters)
        compactor = Compactor(
            settings=settings,
            store=store,
            archive=archive,
            counters=counters,
            client=client,
            models=models,
            metrics=metrics,
            caps=TenantCaps(build_quota(settings, store), metrics.tenants),
        )
        headers = HeaderPolicy(settings)
        services = Services(
            settings=settings,
            client=client,
            headers=headers,
            models=models,
            store=store,
            counters=counters,
            calibration=Calibration(),
            schedule=Schedule(settings.compaction.force_interval_s, compactor.memory),
            compactor=compactor,
            precompactor=Precompactor(settings.compaction, compactor, metrics),
            sightings=SessionSightings(store, memory=compactor.memory),
            windows=LearnedWindows(store, WindowPolicy.from_settings(settings), metrics),
            ceilings=LearnedCeilings(store, WindowPolicy.from_settings(settings), metrics),
            metrics=metrics,
            bodies=BodyBudget(settings.server),
            items=ItemWrites(build_item_store(settings, store)),
            ledger=Ledger(metrics.registry, settings.pricing, models.registry),
            policies=TenantPolicies(settings, tenant_ids.legacy_of),
            tenant_ids=tenant_ids,
            recall=recall,
            recall_tool=RecallTool(recall, client, metrics.registry, settings.compaction, counters),
            loop=asyncio.get_running_loop(),
            discovery=ModelDiscovery(settings, client, headers, metrics),
        )
        opened.pop_all()  # built: from here on, closing is Services.aclose's
    return services
