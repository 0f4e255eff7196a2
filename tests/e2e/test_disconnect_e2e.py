"""A client that gives up cancels its upstream call, whatever phase it is in (issue 8),
through a real proxy. The watcher in-process: tests/upstream/test_disconnect.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.support.chat import FILLER
from tests.support.metrics import metric
from tests.support.servers import proxy_settings, run_server

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


def sim_stat(sim: str, name: str, want: int, within_s: float = 30.0) -> int:
    """The simulator's counter, polled until it reaches ``want`` or time runs out."""
    deadline = time.monotonic() + within_s
    while True:
        value = int(httpx.get(f"{sim}/_sim/stats").json()[name])
        if value >= want or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def give_up(url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    # Only the wait for the answer is cut short (the upstream takes 4 s): on a busy
    # machine connecting and sending may take longer than that wait.
    timeout = httpx.Timeout(30, read=0.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


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


class SummaryGate:
    """The simulator's app, with each summary call (``X-Compaction-Purpose: summarize``)
    held before it is answered until ``release``: ``seen`` is set when one arrives, so
    a test knows which turn summarizes by the summary's own arrival, not by a delay."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen = threading.Event()
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", ()))
        if headers.get(b"x-compaction-purpose", b"").lower() == b"summarize":
            self.seen.set()
            await asyncio.to_thread(self.release.wait, 120)  # set at teardown at the latest
        await self.app(scope, receive, send)


@pytest.fixture
def gated_summaries() -> Iterator[tuple[str, SummaryGate]]:
    gate = SummaryGate(create_simulator_app(SimulatorConfig()))
    try:
        with run_server(gate) as url:
            yield url, gate
    finally:
        gate.release.set()


async def _turns_until_one_summarizes(
    url: str, headers: dict[str, str], gate: SummaryGate
) -> dict[str, Any]:
    """Streamed turns, each answered before the next, until one is waiting on a summary
    call; its client then leaves (the request cancelled, its connection closed) and the
    summary is let through. That turn's body."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    async with httpx.AsyncClient(timeout=120) as client:
        for turn in range(80):
            history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
            body = {"model": "sim-4k", "messages": history, "stream": True}
            sent = asyncio.create_task(
                client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            )
            while not sent.done() and not gate.seen.is_set():
                await asyncio.wait({sent}, timeout=0.01)
            if gate.seen.is_set():
                assert not sent.done(), "the turn was answered before its summary"
                sent.cancel()  # the client gives up while the summary is being written
                with contextlib.suppress(asyncio.CancelledError):
                    await sent
                gate.release.set()
                return body
            assert sent.result().status_code == 200
            history.append({"role": "assistant", "content": "ok"})
    pytest.fail("no turn ever compacted")


def test_a_summary_under_way_finishes_and_frees_the_lock_when_its_client_leaves(
    gated_summaries: tuple[str, SummaryGate], start_proxy: Callable[..., str]
) -> None:
    sim, gate = gated_summaries
    url = start_proxy(
        proxy_settings(
            sim,
            models=[{"match": "sim-4k", "context_window": 4096, "max_output_tokens": 256}],
            # No background summary: the turn past the threshold writes its own.
            compaction={"summary_max_tokens": 400, "precompact_ratio": None},
        )
    )
    headers = {"Authorization": "Bearer sk-tenant-a", "X-Session-Id": "leaves"}
    body = asyncio.run(_turns_until_one_summarizes(url, headers, gate))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = httpx.get(f"{url}/sessions/leaves", headers=headers)
        if found.status_code == 200 and found.json()["version"] > 0:
            break
        time.sleep(0.1)
    snapshot = httpx.get(f"{url}/sessions/leaves", headers=headers).json()
    assert snapshot["version"] == 1  # the summary was finished and kept
    # The next summary needs the session's lock: it takes it at once, none left held to
    # wait out (a held one: a wait for "another" summary, then summary_late).
    forced = {**headers, "X-Compaction": "force"}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=forced, timeout=60)
    assert r.status_code == 200
    assert r.headers["x-compaction-status"] == "compacted"
    assert r.headers["x-compaction-version"] == "2"
    assert metric(url, "compaction_proxy_inline_summary_waits", kind="waited") == 0


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
