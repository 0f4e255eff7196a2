"""Issue 13: the soak, short, in CI; ``python bench/soak.py`` runs it long (bench/README.md).

``tests/support/soaking.py`` starts the simulator, a redis-server and the proxy as processes
and plays many conversations at once through the proxy, every other turn streamed,
compaction firing again and again; it checks what the long run checks (its docstring
lists the invariants): no failed request, no lost message, no duplicate summary, a
version that never goes back, RSS that levels off. Then the two faults the first long
runs found, each with a regression test:

- Idle client connections were closed after 5 s (uvicorn's default): a client, or a
  load balancer, whose own idle timeout is 5 s or longer (httpx 5 s, aiohttp 15 s, AWS
  ALB 60 s) sometimes sent its next request as the proxy closed the connection, and
  that request failed. ``server.keepalive_timeout_s`` (75 s) now outlasts them.
- The upstream pool kept idle connections 60 s, longer than many upstreams do (5 s in
  uvicorn, so vLLM and SGLang, and in llama.cpp's server): a turn sent as the upstream
  closed its connection got a 502. ``upstream.keepalive_timeout_s`` (4 s) now closes
  them first.
- Redis: more than 100 store calls at once (200 concurrent turns) found redis-py's
  connection pool empty, which fails at once; each failure sent the replica to its
  local state for 2 s, where sessions compacted again what Redis already held (2.3
  summaries per stored version, versions going back). The pool now makes a call wait
  for a connection (``proxy.store.redis``).
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import pytest

from proxy.core.session import SessionKey
from proxy.store.redis import RedisOptions, RedisStore
from tests.support.faulty_upstream import Behaviour, Exchange, FaultyUpstream, answer
from tests.support.servers import RedisServer, proxy_settings, redis_binary, run_proxy
from tests.support.soaking import Config, Fleet, idle_connections, soak

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_short_soak_keeps_every_invariant(store: str, tmp_path: Path) -> None:
    if store == "redis":
        redis_binary()  # skips (or in CI fails) without redis-server, as the Redis tests do
    config = Config(
        sessions=20, turns=16, waves=2, words=250, store=store, rss_every_s=0.2, seconds=50
    )
    report = soak(config, tmp_path)
    assert report.problems() == []
    assert report.turns_done == 640
    assert report.streamed == 320
    assert report.statuses["compacted"] > 0
    assert report.sessions_compacted == 40
    assert report.summaries >= 40


def test_idle_connections_do_not_stop_others_being_served(tmp_path: Path) -> None:
    """500 connections that send part of a request head, or nothing, held while 100
    requests are timed."""
    with Fleet("memory", tmp_path) as fleet:
        idle = idle_connections(fleet.url, count=500, requests=100)
        assert httpx.get(f"{fleet.url}/healthz").status_code == 200
    assert idle.problems() == []
    assert idle.held_ms[1] < 1000, idle


def test_an_idle_client_connection_outlasts_common_client_idle_timeouts(sim_reset: str) -> None:
    """Found by the soak: reused after 6 s idle, the connection still serves."""
    with run_proxy(proxy_settings(sim_reset)) as url:
        host, port = url.removeprefix("http://").split(":")
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(6)
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def closes_when_idle(idle_s: float) -> Behaviour:
    """Answer, unless the request came on a connection idle for more than ``idle_s``:
    then hang up without an answer, as an upstream does whose idle timeout fired just
    as the request arrived (on a busy proxy, often: it learns of the close too late)."""
    last: dict[int, float] = {}
    reply = answer()

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        connection = id(ex.writer)
        if connection in last and time.monotonic() - last[connection] > idle_s:
            ex.close()
            return
        await reply(upstream, ex)
        last[connection] = time.monotonic()

    return run


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_upstream_connections_idle_too_long_are_not_reused(path: str) -> None:
    """Found by the soak: a turn sent on a pooled connection the upstream was closing got
    a 502 (aiohttp retries such a failure only for idempotent methods)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with FaultyUpstream() as upstream:
        upstream.chat = closes_when_idle(1.0)
        settings = proxy_settings(upstream.url, upstream={"keepalive_timeout_s": 0.5})
        with run_proxy(settings) as url:
            statuses = []
            for pause in (0.0, 1.2, 0.0, 1.5):
                time.sleep(pause)
                statuses.append(httpx.post(f"{url}{path}", json=body).status_code)
    assert statuses == [200, 200, 200, 200]


@pytest.mark.redis
async def test_a_burst_of_store_calls_waits_for_a_redis_connection(
    redis_server: RedisServer,
) -> None:
    """Found by the soak: 250 snapshot loads at once, more than the pool's connections,
    all succeed. (A generous socket timeout: what is tested is the pool, not how fast a
    loaded machine reads 250 replies.)"""
    store = RedisStore(redis_server.url, ttl_s=60, options=RedisOptions(timeout_s=5.0))
    try:
        keys = [SessionKey("tenant", f"session-{i}", "header") for i in range(250)]
        loaded = await asyncio.gather(*(store.load(k) for k in keys), return_exceptions=True)
    finally:
        await store.aclose()
    assert [result for result in loaded if result is not None] == []
