"""The long-lived objects a request needs, built once in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.compact import Compactor
from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.models import ModelTable
from proxy.store import SnapshotStore
from proxy.upstream import HeaderPolicy, UpstreamClient
from proxy.windows import LearnedWindows


@dataclass(slots=True)
class Services:
    settings: Settings
    client: UpstreamClient
    headers: HeaderPolicy
    models: ModelTable
    store: SnapshotStore
    compactor: Compactor
    windows: LearnedWindows
    metrics: Metrics
