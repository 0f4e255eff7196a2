"""What ``/metrics`` serves: this process's registry, or, with several worker
processes (``server.workers``), the sum over every worker.

Each worker calls ``enable_multiprocess(directory)`` before building its app: its
metrics then live in files there, and ``/metrics``, whichever worker serves it,
shows the sum over every worker (prometheus-client's multiprocess mode), and
``process_*`` sum the supervisor's and the live workers' (process.py).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from proxy.observe.metrics.process import WorkersProcessCollector

__all__ = ["CONTENT_TYPE_LATEST", "enable_multiprocess", "exposition"]


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


def exposition(registry: CollectorRegistry) -> bytes:
    directory = _Multiprocess.directory
    if directory is None:
        return generate_latest(registry)
    # Every worker's files, read at each scrape (dead workers' counters included).
    merged = CollectorRegistry(auto_describe=True)
    MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]  # untyped
    merged.register(WorkersProcessCollector(directory))
    return generate_latest(merged)
