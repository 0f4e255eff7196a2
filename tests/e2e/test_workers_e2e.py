"""server.workers > 1 end to end: worker processes share the port, /metrics sums over all
of them, a worker that dies is replaced, SIGTERM to the supervisor drains every worker
(proxy.serve.workers). The setting in-process: tests/serve/test_workers.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import CHAT, SlowStream, chats_by_worker, serve_process

_CHATS = "compaction_proxy_chat_requests"


def _config(simulator: str, **server: float) -> dict[str, object]:
    return {"upstream": {"base_url": f"{simulator}/v1"}, "server": {"workers": 2, **server}}


def _chat(url: str) -> None:
    # A module-level call: a fresh connection each time, so the kernel picks the worker.
    response = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10)
    assert response.status_code == 200, response.text


def _send(url: str, count: int) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _chat(url), range(count)))


def _scraped_chats(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == _CHATS
        for sample in family.samples
        if sample.name == f"{_CHATS}_total"
    )


def _settled(read: Callable[[], float], expected: float) -> float:
    """``read()`` once it shows ``expected`` (bounded): a request is counted when it has
    ended, a moment after its client has the whole answer (maybe in another process)."""
    deadline = time.monotonic() + 60
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.e2e
def test_metrics_from_any_worker_sum_the_requests_of_all(simulator: str, tmp_path: Path) -> None:
    with serve_process(tmp_path, _config(simulator)) as served:
        workers = served.children()
        assert len(workers) == 2
        sent = 0
        # Until both workers have served some (the kernel chooses; bounded).
        while sent < 400:
            _send(served.url, 20)
            sent += 20
            by_worker = chats_by_worker(served)
            if sorted(by_worker) == sorted(workers) and all(by_worker.values()):
                break
        assert all(by_worker.values()), by_worker
        assert _settled(lambda: sum(chats_by_worker(served).values()), sent) == sent
        by_worker = chats_by_worker(served)
        assert max(by_worker.values()) < sent
        # Each scrape (a fresh connection: either worker) shows the total.
        assert _settled(lambda: _scraped_chats(served.url), sent) == sent
        for _ in range(6):
            assert _scraped_chats(served.url) == sent
        assert "each of the 2 workers keeps its own sessions" in served.log()


@pytest.mark.e2e
def test_sigterm_to_the_supervisor_drains_every_worker_and_leaves_none(
    simulator: str, tmp_path: Path
) -> None:
    with serve_process(tmp_path, _config(simulator, shutdown_timeout_s=20)) as served:
        workers = served.children()
        assert len(workers) == 2
        streams = [SlowStream(served.url, chunk_delay_ms=300).start() for _ in range(3)]
        served.process.send_signal(signal.SIGTERM)
        for stream in streams:
            stream.join(timeout=15)
            assert stream.error is None, stream.error
            assert stream.events[-1] == "data: [DONE]"
        assert served.wait(timeout=15) == 0
        log = served.log()
    assert all(_gone(pid) for pid in workers)
    assert not list(served.tmp.glob("compaction-proxy-metrics-*")), "metrics directory left"
    assert log.count("Application shutdown complete") == 2
    assert "Traceback" not in log


@pytest.mark.e2e
def test_a_worker_that_dies_is_replaced_and_its_counts_kept(simulator: str, tmp_path: Path) -> None:
    with serve_process(tmp_path, _config(simulator)) as served:
        workers = served.children()
        _send(served.url, 10)
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while len(now := served.children()) < 2 or workers[0] in now:
            assert time.monotonic() < deadline, f"no replacement: {now}"
            time.sleep(0.1)
        assert workers[1] in now
        _send(served.url, 10)
        assert _settled(lambda: _scraped_chats(served.url), 20) == 20
        served.process.send_signal(signal.SIGTERM)
        assert served.wait(timeout=15) == 0
    assert f"worker {workers[0]} exited (status -9): starting another" in served.log()


def _scraped(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.e2e
def test_worker_restarts_in_flight_and_process_series_cover_every_process(
    simulator: str, tmp_path: Path
) -> None:
    """Issue 23: restarts counted by the supervisor, in-flight requests summed over the
    workers, and process_* the sum over the supervisor and the live workers."""
    with serve_process(tmp_path, _config(simulator)) as served:
        workers = served.children()
        before = _scraped(served.url)
        assert before["compaction_proxy_worker_restarts_total"] == 0
        assert before["compaction_proxy_build_info"] == 1
        # The scrape itself is not counted: /metrics is not a measured route.
        assert before["compaction_proxy_requests_in_flight"] == 0
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while len(now := served.children()) < 2 or workers[0] in now:
            assert time.monotonic() < deadline, f"no replacement: {now}"
            time.sleep(0.1)
        streams = [SlowStream(served.url, chunk_delay_ms=300).start() for _ in range(3)]
        time.sleep(0.5)
        during = _scraped(served.url)
        for stream in streams:
            stream.join(timeout=15)
        after = _scraped(served.url)
        processes = [served.process.pid, *now]
        rss, one = sum(_rss(pid) for pid in processes), _rss(now[0])
        served.process.send_signal(signal.SIGTERM)
        assert served.wait(timeout=15) == 0
    assert during["compaction_proxy_requests_in_flight"] == 3
    assert after["compaction_proxy_requests_in_flight"] == 0
    assert after["compaction_proxy_worker_restarts_total"] == 1
    assert after["process_resident_memory_bytes"] == pytest.approx(rss, rel=0.25)
    assert after["process_resident_memory_bytes"] > 1.5 * one  # not one process's
