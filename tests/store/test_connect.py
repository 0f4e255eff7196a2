"""store.url to a Redis client (proxy/store/connect.py, cluster.py): a cluster URL's startup nodes
and options, and what no cluster has refused before any connection is made."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from proxy.config import Settings
from proxy.errors import ConfigError
from proxy.store.cluster import parse_cluster_url
from proxy.store.connect import close_redis, open_redis


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
    cluster = open_redis("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", 0.25)
    plain = open_redis("redis://127.0.0.1:6379/0", 0.25)
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
