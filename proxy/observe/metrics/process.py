"""Series about the process rather than the traffic: ``process_*`` (CPU, memory, file
descriptors), ``compaction_proxy_build_info``, requests in flight, and worker restarts.

One process: prometheus-client's ``ProcessCollector`` on the app's own registry. With
several workers (``server.workers``, multiprocess mode) every worker's values live in
files that ``/metrics`` sums (proxy.observe.metrics.exposition), which a ``ProcessCollector``
cannot take part in: ``WorkersProcessCollector`` then reads ``/proc`` for the
supervisor and every live worker and exports their sum (CPU seconds, memory, open
descriptors; the earliest start time), so ``process_resident_memory_bytes`` is what
the pod's proxy holds, as one process would report it. Worker restarts are counted
by the supervisor (proxy.serve.workers), in the same files.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.metrics_core import Metric

# Live workers have a file of their live gauges (dead ones' are removed when reaped).
_LIVE_FILE = re.compile(r"^gauge_live\w*_(\d+)\.db$")
# Families not summed over processes: the earliest start, and one process's limit.
_FIRST = {"process_start_time_seconds": min, "process_max_fds": max}


def _version() -> str:
    try:
        return version("compaction-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@dataclass(slots=True)
class ProcessSeries:
    in_flight: Gauge
    worker_restarts: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ProcessSeries:
        """Declared on ``registry``: build info set, counts at zero, process_* collected."""
        ProcessCollector(registry=registry)
        build = Gauge(
            "compaction_proxy_build_info",
            "Always 1: the proxy's version and the Python that runs it",
            ["version", "python"],
            registry=registry,
            multiprocess_mode="max",
        )
        build.labels(version=_version(), python=platform.python_version()).set(1)
        return cls(
            in_flight=Gauge(
                "compaction_proxy_requests_in_flight",
                "Requests being served now (every route but /healthz, /readyz, /metrics)",
                registry=registry,
                multiprocess_mode="livesum",
            ),
            worker_restarts=worker_restarts(registry),
        )


def worker_restarts(registry: CollectorRegistry) -> Counter:
    """The supervisor's counter (and each worker's zero, so one process exports it too)."""
    return Counter(
        "compaction_proxy_worker_restarts",
        "Worker processes that died while serving and were replaced (server.workers > 1)",
        registry=registry,
    )


class WorkersProcessCollector:
    """``process_*`` of the supervisor and every live worker writing to ``directory``, summed."""

    def __init__(self, directory: str, proc: str = "/proc") -> None:
        self.directory = directory
        self.proc = proc

    def pids(self) -> list[int]:
        live = {int(m.group(1)) for m in map(_LIVE_FILE.match, os.listdir(self.directory)) if m}
        live.add(os.getppid())  # the supervisor: a worker's parent
        return sorted(p for p in live if os.path.exists(f"{self.proc}/{p}"))

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        values: dict[str, list[float]] = {}
        for pid in self.pids():
            one = ProcessCollector(pid=partial(int, pid), proc=self.proc, registry=None)
            for family in _collected(one):
                families.setdefault(family.name, family)
                values.setdefault(family.name, []).extend(s.value for s in family.samples)
        for name, family in families.items():
            combine = _FIRST.get(name, sum)
            merged = Metric(family.name, family.documentation, family.type)
            sample = family.samples[0]
            merged.add_sample(sample.name, {}, combine(values[name]))
            yield merged


def _collected(collector: ProcessCollector) -> Iterable[Metric]:
    # A process that exited between listing and reading yields nothing (ProcessCollector
    # swallows its own OSError).
    return collector.collect()
