"""Issue 23 item 3: a Redis that answers but refuses (a read-only replica, a full Redis,
a cluster node that does not own the keys) reads as failing, truthfully: ``/readyz``
(with ``server.ready_requires_store``) fails within 5 s whether requests flow or not,
the degraded gauge is 1, every failed call is counted by kind, each cause is logged
once, and "shared again" comes once, when writes succeed again. Real redis-server on
loopback, real proxies under uvicorn, the project's simulator as the upstream.
(The same logic on a fake clock: tests/store/test_store_watch.py.)"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from proxy.core.session import SessionKey
from proxy.observe.metrics import Metrics
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.resilient import ResilientStore
from tests.support.servers import (
    RedisServer,
    check_server_allowed,
    free_port,
    proxy_settings,
    redis_binary,
)

pytestmark = pytest.mark.redis

AUTH = {"Authorization": "Bearer sk-health"}
READY_WITHIN_S = 5.0


def settings(sim: str, redis_url: str) -> Any:
    return proxy_settings(sim, store={"url": redis_url}, server={"ready_requires_store": True})


def ready(url: str) -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{url}/readyz", timeout=5)
    return r.status_code, r.json()


def until_ready_is(url: str, status: int, limit_s: float = 15.0) -> float:
    """Seconds until /readyz answers ``status`` (polled every 50 ms)."""
    started = time.monotonic()
    while ready(url)[0] != status:
        assert time.monotonic() - started < limit_s, f"/readyz never answered {status}"
        time.sleep(0.05)
    return time.monotonic() - started


def sample(url: str, name: str, **labels: str) -> float:
    """A series' value from /metrics (summed over the series that carry ``labels``)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        match = re.match(rf"{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match and wanted in (match.group(1) or ""):
            total += float(match.group(2))
    return total


def turn(client: httpx.Client, url: str, session: str) -> int:
    """One chat turn of its own session; its status."""
    r = client.post(
        f"{url}/v1/chat/completions",
        json={"model": "sim", "messages": [{"role": "user", "content": "hi"}]},
        headers={**AUTH, "X-Session-Id": session},
    )
    return r.status_code


def turns(url: str, n: int, label: str) -> list[int]:
    with httpx.Client(timeout=30) as client:
        return [turn(client, url, f"{label}-{i}") for i in range(n)]


class Traffic:
    """Chat turns, each of a new session (a load, and a sighting to write), one after
    another in a thread until stopped: bounded in count and time."""

    def __init__(self, url: str, limit: int = 3000, limit_s: float = 60.0) -> None:
        self.url, self.limit, self.limit_s = url, limit, limit_s
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        with httpx.Client(timeout=30) as client:
            for n in range(self.limit):
                if self._stop.is_set() or time.monotonic() - started > self.limit_s:
                    return
                self.statuses.append(turn(client, self.url, f"health-{n}"))

    @property
    def turns(self) -> int:
        return len(self.statuses)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def store_logs(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "proxy.store" and text in r.getMessage()
    ]


def test_a_read_only_redis_fails_readiness_within_5s_while_requests_flow(
    sim_reset: str,
    redis_server: RedisServer,
    redis_primary: RedisServer,
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = start_proxy(settings(sim_reset, redis_server.url))
    raw = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    raw.config_set("repl-diskless-load", "swapdb")  # no dump.rdb written in the cwd
    try:
        with caplog.at_level(logging.WARNING, "proxy.store"), Traffic(url) as traffic:
            until_ready_is(url, 200)
            time.sleep(0.5)  # turns served from Redis
            assert sample(url, "compaction_proxy_store_failures_total") == 0
            raw.replicaof("127.0.0.1", redis_primary.port)  # as a failover demotes a primary
            took = until_ready_is(url, 503)
            assert ready(url) == (503, {"ready": False, "store": "degraded (readonly)"})
            failing_from = traffic.turns
            time.sleep(1.0)
            failing_turns = traffic.turns - failing_from
            assert sample(url, "compaction_proxy_store_degraded") == 1
            readonly = sample(url, "compaction_proxy_store_failures_total", kind="readonly")
            fallbacks = sample(url, "compaction_proxy_store_fallbacks_total")
            assert store_logs(caplog, "reachable again") == [], "no 'shared again' while failing"

            raw.replicaof("no", "one")  # a primary again: writes succeed
            recovered = until_ready_is(url, 200)
            assert ready(url) == (200, {"ready": True, "store": "ok"})
            assert sample(url, "compaction_proxy_store_degraded") == 0
        errors = raw.info("errorstats").get("errorstat_READONLY", {}).get("count", 0)
    finally:
        raw.close()
    assert took < READY_WITHIN_S, f"/readyz took {took:.2f} s to fail"
    assert recovered < READY_WITHIN_S
    assert set(traffic.statuses) == {200}, "every turn served, from local state meanwhile"
    # Every turn while failing met READONLY at least once (its load refreshes the TTL, a
    # write); each was counted, and served from local state, not one per cool-down.
    assert failing_turns >= 5
    assert readonly >= failing_turns
    assert fallbacks >= failing_turns
    assert readonly <= errors, "no more than Redis refused"
    assert len(store_logs(caplog, "store unavailable (readonly")) == 1
    assert len(store_logs(caplog, "reachable again")) == 1


def fill(client: redis.Redis) -> None:
    """Make the Redis full: values written past 2 MB, then ``maxmemory 1mb`` with
    ``noeviction``, so every write that may grow memory is refused (OOM)."""
    n = 0
    while int(client.info("memory")["used_memory"]) < 2 << 20:
        client.set(f"filler:{n}", b"x" * 4096)
        n += 1
        assert n < 5000, "redis never grew"
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1mb")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("one-more", b"x")


def test_a_full_redis_fails_readiness_within_5s_with_no_requests_at_all(
    sim_reset: str,
    redis_server: RedisServer,
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = start_proxy(settings(sim_reset, redis_server.url))
    raw = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        with caplog.at_level(logging.WARNING, "proxy.store"):
            assert ready(url) == (200, {"ready": True, "store": "ok"})
            assert turns(url, 5, "before") == [200] * 5
            fill(raw)
            assert raw.ping(), "a PING still passes"
            took = until_ready_is(url, 503)  # a probe's write: nothing else writes
            assert ready(url) == (503, {"ready": False, "store": "degraded (oom)"})
            assert sample(url, "compaction_proxy_store_degraded") == 1
            assert sample(url, "compaction_proxy_store_failures_total", kind="oom") >= 1
            assert sample(url, "compaction_proxy_store_errors_total", operation="probe") >= 1

            # Each new session's sighting is a write the full Redis refuses.
            assert turns(url, 20, "full") == [200] * 20
            oom = sample(url, "compaction_proxy_store_failures_total", kind="oom")
            noted = sample(url, "compaction_proxy_store_fallbacks_total", operation="note_seen")
            assert oom >= 20
            assert noted >= 20
            # Reads a full Redis still answers (a session's snapshots and sighting) end nothing.
            assert httpx.get(f"{url}/sessions/full-0", headers=AUTH).status_code == 200
            assert ready(url) == (503, {"ready": False, "store": "degraded (oom)"})
            assert sample(url, "compaction_proxy_store_degraded") == 1
            assert store_logs(caplog, "reachable again") == []

            raw.config_set("maxmemory", 0)  # room again
            recovered = until_ready_is(url, 200)
            assert sample(url, "compaction_proxy_store_degraded") == 0
    finally:
        raw.close()
    assert took < READY_WITHIN_S, f"/readyz took {took:.2f} s to fail"
    assert recovered < READY_WITHIN_S
    assert len(store_logs(caplog, "store unavailable (oom")) == 1
    assert len(store_logs(caplog, "reachable again")) == 1


class ClusterPair:
    """Two Redis Cluster nodes on loopback: ``owner`` serves every slot, ``other`` none,
    so every keyed command sent to ``other`` is answered MOVED."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ports: list[tuple[int, int]] = []
        self._dir = tempfile.TemporaryDirectory()

    def start(self) -> None:
        check_server_allowed()
        for name in ("owner", "other"):
            port, bus = free_port(), free_port()  # the bus port set: port + 10000 may not exist
            args = ["--bind", "127.0.0.1", "--port", str(port), "--cluster-port", str(bus)]
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"{name}.conf"]
            args += ["--save", "", "--appendonly", "no", "--dir", self._dir.name]
            self.processes.append(
                subprocess.Popen([redis_binary(), *args], stdout=subprocess.DEVNULL)
            )
            self.ports.append((port, bus))
        owner, other = (self.client(i) for i in range(2))
        try:
            self._wait(owner)
            self._wait(other)
            owner.execute_command("CLUSTER ADDSLOTSRANGE", 0, 16383)
            other.execute_command("CLUSTER MEET", "127.0.0.1", *self.ports[0])
            deadline = time.monotonic() + 20
            while other.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                assert time.monotonic() < deadline, "the cluster never formed"
                time.sleep(0.05)
        finally:
            owner.close()
            other.close()

    def client(self, i: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.ports[i][0], socket_timeout=5)

    @staticmethod
    def _wait(client: redis.Redis) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    @property
    def other_url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[1][0]}/0"

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(timeout=10)
        self._dir.cleanup()


@pytest.fixture
def cluster_pair() -> Iterator[ClusterPair]:
    pair = ClusterPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


async def test_a_cluster_node_answering_moved_reads_as_degraded_and_every_call_counts(
    cluster_pair: ClusterPair,
) -> None:
    # In-process: a plain redis:// URL at a cluster node is refused at start-up (item 1),
    # yet the store must still tell MOVED apart if a node's slots move under it.
    metrics = Metrics.create()
    store = ResilientStore(RedisStore(cluster_pair.other_url, 60), MemoryStore(60), metrics)
    try:
        health = await store.health()
        assert str(health) == "degraded (moved)"
        for n in range(10):
            key = SessionKey("tenant", f"moved-{n}", "header")
            assert await store.load(key) is None
            assert await store.acquire(key, 10) is not None  # locally
    finally:
        await store.aclose()
    registry = metrics.registry
    moved = registry.get_sample_value("compaction_proxy_store_failures_total", {"kind": "moved"})
    assert moved == 21  # the probe, and each load and each acquire: every one
    assert registry.get_sample_value("compaction_proxy_store_degraded") == 1
    fallbacks = registry.get_sample_value(
        "compaction_proxy_store_fallbacks_total", {"operation": "acquire"}
    )
    assert fallbacks == 10
