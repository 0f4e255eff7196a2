"""store.url to a Redis client (proxy/store/connect.py, cluster.py): a cluster URL's startup nodes
and options, and what no cluster has refused before any connection is made; the keys a
cluster's readiness probe writes, for a slot map given by hand."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from proxy.config import Settings, StoreSettings
from proxy.errors import ConfigError
from proxy.observe.metrics import Metrics
from proxy.store import build_store
from proxy.store.cluster import QueuedCluster, open_cluster, parse_cluster_url, slot_tags
from proxy.store.connect import RECONNECT_BASE_S, close_redis, open_redis
from proxy.store.keys import KeyLayout
from proxy.store.redis import RedisOptions, RedisStore
from proxy.store.resilient import ResilientStore


def test_a_cluster_url_names_every_startup_node() -> None:
    nodes, options = parse_cluster_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7001,[::1]:7002/0")
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002)]
    assert "ssl" not in options


def test_credentials_and_tls_ride_as_with_redis_urls() -> None:
    url = "rediss+cluster://app:p%40ss@r1:6380,r2?ssl_cert_reqs=none"
    nodes, options = parse_cluster_url(url)
    assert nodes == [("r1", 6380), ("r2", 6379)]
    assert options["username"] == "app"
    assert options["password"] == "p@ss"
    assert options["ssl"] is True
    assert options["ssl_cert_reqs"] == "none"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster:///0", "names no node"),
        ("redis+cluster://r1:7000/3", "database 0 only"),
        ("redis+cluster://r1:port", "not host:port"),
    ],
)
def test_what_no_cluster_has_is_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cluster_url(url)


async def test_a_cluster_url_opens_a_cluster_client_and_a_plain_one_does_not() -> None:
    cluster = open_redis("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", 0.25, 100, 2.0)
    plain = open_redis("redis://127.0.0.1:6379/0", 0.25, 100, 2.0)
    try:
        assert isinstance(cluster, RedisCluster)
        assert not isinstance(plain, RedisCluster)
    finally:
        await close_redis(cluster)
        await close_redis(plain)


def test_settings_accept_cluster_urls_and_refuse_braces_in_their_prefix() -> None:
    assert Settings(store={"url": "rediss+cluster://r1:7000"}).store.url.startswith("rediss+")
    with pytest.raises(ValueError, match="prefix"):
        Settings(store={"url": "redis+cluster://r1:7000", "prefix": "app{1}"})


URLS = {
    "standalone": "redis://127.0.0.1:6379/0",
    "sentinel": "redis+sentinel://127.0.0.1:26379/svc",
    "cluster": "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
}


def _limits(client: Any) -> tuple[float, int, float]:
    """A client's call timeout, connection cap and wait for a free connection."""
    if isinstance(client, QueuedCluster):
        options = client.nodes_manager.connection_kwargs
        return options["socket_timeout"], options["max_connections"], client._wait_s
    pool = client.connection_pool
    return pool.connection_kwargs["socket_timeout"], pool.max_connections, pool.timeout


@pytest.mark.parametrize("topology", list(URLS))
async def test_the_store_settings_reach_every_topologys_client(topology: str) -> None:
    """``store.timeout_s``, ``max_connections`` and ``pool_wait_s`` from the config are
    what ``build_store``'s Redis client uses (the cluster's places too)."""
    store = {"url": URLS[topology], "timeout_s": 1.5, "max_connections": 7, "pool_wait_s": 4.0}
    built = build_store(Settings(store=store), Metrics.create())
    try:
        assert isinstance(built, ResilientStore)
        assert isinstance(built.remote, RedisStore)
        client = built.remote.client
        assert _limits(client) == (1.5, 7, 4.0)
        if isinstance(client, QueuedCluster):
            assert client._places._value == 7  # calls at once, each a connection per node
    finally:
        await built.aclose()


def test_redis_options_default_to_the_store_settings_defaults() -> None:
    defaults, settings = RedisOptions(), StoreSettings()
    assert defaults.timeout_s == settings.timeout_s == 0.25
    assert defaults.max_connections == settings.max_connections == 100
    assert defaults.pool_wait_s == settings.pool_wait_s == 2.0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", 31),
        ("max_connections", 0),
        ("max_connections", 10_001),
        ("pool_wait_s", 0),
        ("pool_wait_s", 61),
    ],
)
def test_store_limits_out_of_bounds_are_refused(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=key):
        Settings(store={key: value})


def _reconnect_backoff(client: Any) -> Any:
    """What a client waits before it reconnects and resends a failed command."""
    if isinstance(client, QueuedCluster):
        return client.retry._backoff
    return client.connection_pool.connection_kwargs["retry"]._backoff


@pytest.mark.parametrize("topology", list(URLS))
async def test_reconnects_after_a_failed_connection_are_jittered(topology: str) -> None:
    """After an outage every process's first calls fail their connection at about the
    same moment: each waits a delay of its own before reconnecting, never none (the one
    server and Sentinel clients: RECONNECT_BASE_S to twice that)."""
    client = open_redis(URLS[topology], 0.25, 100, 2.0)
    try:
        backoff = _reconnect_backoff(client)
        backoff.reset()
        delays = [backoff.compute(1) for _ in range(200)]
    finally:
        await close_redis(client)
    assert len(set(delays)) > 150, "not jittered"
    assert max(delays) - min(delays) > 0.01
    if topology != "cluster":  # the cluster's retry is for redirections: 0-20 ms
        assert min(delays) >= RECONNECT_BASE_S
        assert max(delays) <= 2 * RECONNECT_BASE_S
        retry = client.connection_pool.connection_kwargs["retry"]
        assert retry._retries == 1  # once: a call stays bounded
        assert retry._supported_errors == (RedisConnectionError,)  # a timeout is not retried


def test_every_slot_has_a_probe_tag_that_hashes_to_it() -> None:
    tags = slot_tags()
    assert len(tags) == REDIS_CLUSTER_HASH_SLOTS
    probe = KeyLayout(tagged=True).probe
    assert [key_slot(probe(tag).encode()) for tag in tags] == list(range(len(tags)))


async def test_the_probe_has_a_key_on_a_primary_that_owns_only_slots_small_tags_miss() -> None:
    """Mid-reshard a primary may own a few slots only, none of them one that the tags
    0-65535 hash to: it is probed (and counted) like the others."""
    missed = sorted(
        set(range(REDIS_CLUSTER_HASH_SLOTS)) - {key_slot(b"%d" % n) for n in range(65_536)}
    )
    assert missed, "every slot reached by small tags: nothing to tell"
    one, two, few = (ClusterNode("127.0.0.1", port) for port in (7000, 7001, 7002))
    slots = {s: [one if s < REDIS_CLUSTER_HASH_SLOTS // 2 else two] for s in range(16_384)}
    for s in missed[:3]:
        slots[s] = [few]
    cluster = open_cluster("redis+cluster://127.0.0.1:7000", 0.25, places=4, wait_s=1.0)
    try:
        cluster.nodes_manager.slots_cache = slots
        cluster._initialize = False  # the slot map above, not one read from a node
        keys = await cluster.keys_per_primary(KeyLayout(tagged=True).probe)
    finally:
        await close_redis(cluster)
    assert sorted(keys) == sorted(node.name for node in (one, two, few))
    for node, name in keys.items():
        assert slots[key_slot(name.encode())][0].name == node
