"""A replica that dies mid-summary holds up its session once, not on every turn."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from proxy.simulator import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.support.chat import FILLER
from tests.support.metrics import metric
from tests.support.servers import RedisServer, proxy_settings, run_server
from tests.support.starting import start_listening

WAIT_S = 2.0
HEADERS = {"Authorization": "Bearer sk-tenant-a", "X-Session-Id": "orphaned"}


@pytest.fixture
def slow_summaries() -> Iterator[str]:
    """Non-streamed answers (summaries) take 4 s; streamed turns answer at once."""
    with run_server(create_simulator_app(SimulatorConfig(latency_ms=4000))) as url:
        yield url


def config(sim: str, redis_url: str) -> dict[str, Any]:
    return {
        "upstream": {"base_url": f"{sim}/v1"},
        "store": {"url": redis_url},
        "models": [{"match": "sim-4k", "context_window": 4096, "max_output_tokens": 256}],
        "compaction": {"summary_max_tokens": 400, "wait_for_summary_s": WAIT_S},
    }


def spawn(tmp_path: Path, settings: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str]:
    path = tmp_path / "replica.yaml"
    path.write_text(yaml.safe_dump(settings))
    cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path)]
    process, port = start_listening(
        lambda port: [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        tmp_path / "replica.log",
        "/healthz",
        "the replica",
    )
    return process, f"http://127.0.0.1:{port}"


def turn(url: str, history: list[dict[str, Any]], timeout: float | httpx.Timeout = 60) -> float:
    started = time.monotonic()
    body = {"model": "sim-4k", "messages": history, "stream": True}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=timeout)
    assert r.status_code == 200
    return time.monotonic() - started


@pytest.mark.redis
def test_turns_after_a_dead_holders_lock_wait_only_once(
    slow_summaries: str,
    start_proxy: Callable[..., str],
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    settings = config(slow_summaries, redis_server.url)
    doomed, doomed_url = spawn(tmp_path, settings)
    raw = redis.Redis.from_url(redis_server.url)
    try:
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
        for i in range(40):
            history.append({"role": "user", "content": f"Turn {i}: {FILLER}"})
            history.append({"role": "assistant", "content": "ok"})
        history.append({"role": "user", "content": "go on"})
        with pytest.raises(httpx.ReadTimeout):  # the replica starts summarizing (4 s)...
            turn(doomed_url, history, timeout=httpx.Timeout(30, read=0.5))
        deadline = time.monotonic() + 60
        while not raw.keys("cp:lock:*") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert raw.keys("cp:lock:*"), "the doomed replica holds the session's lock"
        doomed.send_signal(signal.SIGKILL)  # ...and dies holding it
        doomed.wait(timeout=10)

        survivor = start_proxy(
            proxy_settings(
                slow_summaries,
                store={"url": redis_server.url},
                models=settings["models"],
                compaction=settings["compaction"],
            )
        )
        first = turn(survivor, history)
        assert first >= WAIT_S  # nobody can tell a slow holder from a dead one, once
        waited = "compaction_proxy_inline_summary_waits"
        assert metric(survivor, waited, kind="waited") == 1
        for _ in range(3):
            turn(survivor, history)
        # Counted for each turn that waits on another's summary: none of the later ones.
        assert metric(survivor, waited, kind="waited") == 1
        assert raw.keys("cp:lock:*"), "the orphaned lock is still there: nothing stole it"
    finally:
        if doomed.poll() is None:
            doomed.kill()
        raw.close()
