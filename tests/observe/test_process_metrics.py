"""Issue 23: the process's own series (proxy.observe.metrics.process): process_*, build
info, requests in flight and worker restarts, on the app's registry from start-up;
summed over the supervisor and the workers with several: tests/e2e/test_workers_e2e.py.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.metrics import Metrics
from proxy.observe.metrics.process import WorkersProcessCollector


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_a_fresh_proxy_exports_process_build_in_flight_and_restart_series() -> None:
    samples = _samples(generate_latest(Metrics.create().registry).decode())
    assert samples["process_resident_memory_bytes"][0][1] > 10 * 2**20
    assert samples["process_cpu_seconds_total"][0][1] > 0
    assert samples["process_open_fds"][0][1] > 0
    [(labels, value)] = samples["compaction_proxy_build_info"]
    assert labels == {"version": "0.1.0", "python": platform.python_version()}
    assert value == 1
    assert samples["compaction_proxy_requests_in_flight"] == [({}, 0)]
    assert samples["compaction_proxy_worker_restarts_total"] == [({}, 0)]


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_workers_process_series_sum_the_live_workers_and_the_supervisor(tmp_path: Path) -> None:
    """A live "worker" (this process, by its live gauge file), the supervisor (its parent),
    and a dead worker (only its counter file is left): memory is the two live ones' sum."""
    me, parent = os.getpid(), os.getppid()
    for name in (f"gauge_livesum_{me}.db", "counter_4194303.db"):
        (tmp_path / name).write_bytes(b"")
    collector = WorkersProcessCollector(str(tmp_path))
    assert collector.pids() == sorted({me, parent})
    summed = {s.name: s.value for f in collector.collect() for s in f.samples}
    assert summed["process_resident_memory_bytes"] == pytest.approx(
        _rss(me) + _rss(parent), rel=0.2
    )
    assert summed["process_resident_memory_bytes"] > max(_rss(me), _rss(parent))
    with open(f"/proc/{me}/limits") as limits:
        assert str(int(summed["process_max_fds"])) in limits.read()  # one process's, not two
    assert summed["process_cpu_seconds_total"] > 0
    assert summed["process_open_fds"] > 2


async def test_a_request_is_in_flight_while_it_is_served_and_not_after() -> None:
    """RecordRequests moves the gauge's value itself (no ``Gauge.inc`` checks per request):
    one while the app serves the request, none once it has answered."""
    from starlette.types import Message, Receive, Scope, Send

    from proxy.config import Settings
    from proxy.observe.record_requests import RecordRequests
    from proxy.observe.recorder import Recorder

    metrics = Metrics.create()
    name = "compaction_proxy_requests_in_flight"
    seen: list[float | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(metrics.registry.get_sample_value(name))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        pass

    recorder = Recorder(metrics, Settings())
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}
    for _ in range(2):
        await RecordRequests(app)({**scope, "state": {"recorder": recorder}}, receive, send)
        seen.append(metrics.registry.get_sample_value(name))
    assert seen == [1.0, 0.0, 1.0, 0.0]
