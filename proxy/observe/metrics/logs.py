"""The log writer's series (observe/logs.py), on ``Metrics.registry``:
request lines whose fields could not be made, each written as an error line naming its
request instead. Built with the app (services.py); the process's writer moves it from
its thread, only for such a line. With several workers each worker's counter is in the
metrics directory's files, which ``/metrics`` sums (a dead worker's count kept), as every
counter's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from proxy.observe import logs


def count_unformatted_lines(registry: CollectorRegistry) -> Counter:
    """Declared on ``registry`` at zero; from now on the process's log writer counts there
    (the writer is one per process: the last registry given has its count)."""
    counter = Counter(
        "compaction_proxy_request_lines_unformatted",
        "Request log lines whose fields could not be made: each written as an error line "
        "naming its request instead (logger proxy.access)",
        registry=registry,
    )
    logs.count_unformatted_with(counter.inc)
    return counter
