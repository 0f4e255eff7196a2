"""A client that gives up cancels its upstream call, whatever phase it is in (issue 8),
through a real proxy. The watcher in-process: tests/upstream/test_disconnect.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.support.chat import FILLER
from tests.support.servers import proxy_settings, run_server

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


def sim_stat(sim: str, name: str, want: int, within_s: float = 3.0) -> int:
    """The simulator's counter, polled until it reaches ``want`` or time runs out."""
    deadline = time.monotonic() + within_s
    while True:
        value = int(httpx.get(f"{sim}/_sim/stats").json()[name])
        if value >= want or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def give_up(url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=0.5)


def test_a_non_streamed_call_is_cancelled_when_its_client_leaves(
    proxy: str, sim_reset: str
) -> None:
    give_up(proxy, CHAT, {"X-Sim-Latency-Ms": "4000"})
    assert sim_stat(sim_reset, "calls_abandoned", 1) == 1
    metrics = httpx.get(f"{proxy}/metrics").text
    assert 'compaction_proxy_client_disconnects_total{phase="upstream"} 1.0' in metrics


def test_a_stream_is_cancelled_when_its_client_leaves_before_the_headers(
    proxy: str, sim_reset: str
) -> None:
    give_up(proxy, {**CHAT, "stream": True}, {"X-Sim-Header-Delay-Ms": "4000"})
    assert sim_stat(sim_reset, "calls_abandoned", 1) == 1


def test_a_client_that_waits_gets_its_answer(proxy: str, sim_reset: str) -> None:
    r = httpx.post(f"{proxy}/v1/chat/completions", json=CHAT, headers={"X-Sim-Latency-Ms": "300"})
    assert r.status_code == 200
    assert sim_stat(sim_reset, "calls_abandoned", 1, within_s=0.3) == 0


@pytest.fixture
def slow_summaries() -> Iterator[str]:
    """Non-streamed answers (the proxy's summary calls) take 1.5 s; streams do not."""
    with run_server(create_simulator_app(SimulatorConfig(latency_ms=1500))) as url:
        yield url


def test_a_summary_under_way_finishes_and_frees_the_lock_when_its_client_leaves(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        proxy_settings(
            slow_summaries,
            models=[{"match": "sim-4k", "context_window": 4096, "max_output_tokens": 256}],
            compaction={"summary_max_tokens": 400},
        )
    )
    headers = {"Authorization": "Bearer sk-tenant-a", "X-Session-Id": "leaves"}
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(80):
        history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        body = {"model": "sim-4k", "messages": history, "stream": True}
        try:  # streamed turns answer at once; only a turn that summarizes takes 1.5 s
            r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=0.5)
        except httpx.ReadTimeout:
            break  # the client gave up while the summary was being written
        assert r.status_code == 200
        history.append({"role": "assistant", "content": "ok"})
    else:
        pytest.fail("no turn ever compacted")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = httpx.get(f"{url}/sessions/leaves", headers=headers)
        if found.status_code == 200 and found.json()["version"] > 0:
            break
        time.sleep(0.1)
    snapshot = httpx.get(f"{url}/sessions/leaves", headers=headers).json()
    assert snapshot["version"] == 1  # the summary was finished and kept
    started = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert r.status_code == 200
    assert r.headers["x-compaction-status"] == "snapshot"
    assert time.monotonic() - started < 1.0  # no lock left to wait out


def test_a_request_through_the_proxy_leaves_no_reference_cycle(proxy: str) -> None:
    """Nothing a plain chat request allocates waits for the garbage collector. (The client
    is http.client: httpx's own requests and responses are held in cycles.)"""
    import gc
    import http.client
    import json
    from urllib.parse import urlsplit

    where = urlsplit(proxy)
    conn = http.client.HTTPConnection(where.hostname or "", where.port)
    body = json.dumps(CHAT)
    headers = {"Authorization": "Bearer sk-cycles", "Content-Type": "application/json"}

    def chat() -> None:
        conn.request("POST", "/v1/chat/completions", body, headers)
        response = conn.getresponse()
        assert response.status == 200
        response.read()

    try:
        for _ in range(3):  # connections, caches and lazily built tables settle
            chat()
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                chat()
            left = gc.collect()
        finally:
            gc.enable()
    finally:
        conn.close()
    assert left < 20, f"{left} objects in reference cycles after 20 requests"
