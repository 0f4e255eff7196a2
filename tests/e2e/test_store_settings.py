"""``store.timeout_s`` and ``store.max_connections`` against real servers: a slow Redis
is reached through a config with a larger timeout, and a process opens no more
connections than the cap to any server (standalone, each node of a cluster, the primary
behind Sentinel) while a burst of calls waits for them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.config import Settings
from proxy.core.session import SessionKey
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import build_store
from proxy.store.redis import RedisStore
from proxy.store.resilient import ResilientStore
from tests.support.redis_cluster import RedisCluster
from tests.support.sentinels import SentinelGroup
from tests.support.servers import RedisServer
from tests.support.snapshots import snap

pytestmark = pytest.mark.redis

# Calls of one burst, all started at once: far more than the cap.
BURST = 60
CAP = 3


async def open_store(url: str, **store: Any) -> tuple[ResilientStore, RedisStore]:
    """The store ``build_store`` makes from a config naming ``url``, and its Redis store
    (the outage handling left aside, so a failure shows); the caller closes the first."""
    built = build_store(Settings(store={"url": url, **store}), Metrics.create())
    assert isinstance(built, ResilientStore)
    assert isinstance(built.remote, RedisStore)
    return built, built.remote


def client_count(node: Any) -> int:
    """Connections the server ``node`` (a redis-py client of it) has open, its own too,
    but none that last read a cluster's slot map: redis-py reads it on a connection of
    its own (one in all, to a startup node), besides the nodes' pools."""
    return sum(1 for c in node.client_list() if not c["cmd"].startswith("cluster|"))


async def test_a_slow_redis_is_reached_through_a_larger_store_timeout(
    redis_server: RedisServer,
) -> None:
    """A server that takes a second to answer: the default 0.25 s gives up, a config
    with ``timeout_s: 10`` waits for the answer."""
    short, short_remote = await open_store(redis_server.url)
    long, long_remote = await open_store(redis_server.url, timeout_s=10)
    pauser = redis_server.client()
    try:
        for remote in (short_remote, long_remote):  # connected before the server stalls
            assert await remote.ping()
        # Every client's commands wait this long (the test's own included); the short
        # call has given up long before, however busy the machine.
        pauser.client_pause(3000, all=True)
        outcomes = await asyncio.gather(
            short_remote.save(SessionKey("t", "short", "header"), snap(1)),
            long_remote.save(SessionKey("t", "long", "header"), snap(1)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], StoreError), outcomes
        assert "TimeoutError" in outcomes[0].message
        assert outcomes[1] is True, outcomes
        assert await long_remote.load(SessionKey("t", "long", "header")) is not None
    finally:
        pauser.close()
        await short.aclose()
        await long.aclose()


def _data_nodes(request: pytest.FixtureRequest, topology: str) -> tuple[str, list[Any]]:
    """The store URL of ``topology`` and a client of each server holding its data."""
    if topology == "standalone":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url, [server.client()]
    if topology == "cluster":
        import redis

        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        nodes = [redis.Redis.from_url(u, socket_timeout=2) for u in cluster.node_urls]
        return cluster.url, nodes
    group: SentinelGroup = request.getfixturevalue("sentinel_shared")
    return group.url, [group.primary().client()]


@pytest.mark.parametrize("topology", ["standalone", "cluster", "sentinel"])
async def test_store_max_connections_caps_each_servers_connections_under_a_burst(
    request: pytest.FixtureRequest, topology: str
) -> None:
    """``BURST`` writes at once through a store capped at ``CAP`` connections: every one
    succeeds (waiting its turn, ``pool_wait_s``), and no server sees more than ``CAP``
    connections of it."""
    url, nodes = _data_nodes(request, topology)
    built, remote = await open_store(url, max_connections=CAP, pool_wait_s=30)
    try:
        before = [client_count(n) for n in nodes]  # sentinels, replicas, this test's own
        keys = [SessionKey("t", f"burst-{i}", "header") for i in range(BURST)]
        saved = await asyncio.gather(*(remote.save(k, snap(1)) for k in keys))
        assert saved == [True] * BURST
        # The pool keeps what it opened: what each server counts now is the peak.
        opened = [client_count(n) - b for n, b in zip(nodes, before, strict=True)]
        assert all(0 <= n <= CAP for n in opened), opened
        assert sum(opened) >= 1, opened
    finally:
        await built.aclose()
        for node in nodes:
            node.close()


async def test_a_larger_cap_lets_the_same_burst_open_more_connections(
    redis_server: RedisServer,
) -> None:
    """The burst above does contend: with a cap above it, it opens more than ``CAP``."""
    built, remote = await open_store(redis_server.url, max_connections=BURST)
    node = redis_server.client()
    try:
        before = client_count(node)
        keys = [SessionKey("t", f"burst-{i}", "header") for i in range(BURST)]
        assert all(await asyncio.gather(*(remote.save(k, snap(1)) for k in keys)))
        assert client_count(node) - before > CAP
    finally:
        await built.aclose()
        node.close()
