"""The Redis client a ``store.url`` names, and what start-up checks of it.

```
redis://  rediss://  unix://           one server: redis-py's Redis on a blocking pool
redis+cluster://h:p[,h:p…][/0]         a Redis Cluster: redis-py's asyncio RedisCluster,
rediss+cluster://…                     started from every node named (TLS for rediss+)
```

``open_redis`` is the one place a URL becomes a client (one branch per topology).
Credentials ride in the userinfo as with ``redis://`` (``redis+cluster://user:pw@h:p,…``)
and query parameters (``?ssl_ca_certs=…``) are redis-py's, read by its ``parse_url``.

A plain URL that reaches a cluster node would work for the keys that node happens to
own and fail every other one with ``MOVED``: each replica would then summarize every
session itself while the store looks reachable. ``refuse_cluster_node`` (start-up and
``check-config``) turns that into a refusal naming ``redis+cluster://``.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisClusterException, RedisError

from proxy.errors import ConfigError

log = logging.getLogger("proxy.store")

Client = aioredis.Redis | RedisCluster
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
# What a call to either client raises: a cluster that cannot be reached or mapped raises
# RedisClusterException, which is not a RedisError.
ERRORS = (RedisError, RedisClusterException)

# Connections to Redis per process (per node of a cluster), and how long a call waits
# for one when all are busy (each call holds one for a millisecond or so).
_POOL_SIZE = 100
_POOL_WAIT_S = 2.0


def is_cluster(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def open_redis(url: str, timeout_s: float) -> Client:
    """The client for ``url``, each call bounded by ``timeout_s``; the caller closes it."""
    if is_cluster(url):
        return _cluster(url, timeout_s)
    # Blocking: a call that finds every connection busy waits for one. The default
    # pool fails it at once, and a burst of turns would take this replica off Redis
    # (ResilientStore) with nothing wrong with Redis.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=_POOL_SIZE,
        timeout=_POOL_WAIT_S,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=30,
        retry_on_timeout=False,
    )
    return aioredis.Redis(connection_pool=pool)


async def close_redis(client: Client) -> None:
    """Close ``client`` and its connections (the pool is the store's, not shared)."""
    if isinstance(client, RedisCluster):
        await client.aclose()
    else:
        await client.aclose(close_connection_pool=True)


def _cluster(url: str, timeout_s: float) -> RedisCluster:
    nodes, options = parse_cluster_url(url)
    try:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            max_connections=_POOL_SIZE,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
            # One more try after a node fails or a slot moves (the client re-reads the
            # slot map first), not redis-py's three with back-off: a call stays short.
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=1),
            **options,  # type: ignore[arg-type]  # parse_url's values, typed per key
        )
    except TypeError as exc:  # a query parameter no client option has
        raise ConfigError(f"store.url: {exc}") from None


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, object]]:
    """A ``redis+cluster://`` URL's startup nodes and the client options of the rest
    (credentials, TLS, query parameters); ``ConfigError`` for one no cluster has."""
    scheme, _, rest = url.partition("+cluster://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]  # tail: the /db and ?query
    userinfo, at, hosts = netloc.rpartition("@")
    nodes = [_node(part) for part in hosts.split(",") if part]
    if not nodes:
        raise ConfigError("store.url: redis+cluster:// names no node (host:port[,host:port…])")
    # redis-py reads the rest (unquoting, TLS, typed query parameters) as for one node.
    single = f"{scheme}://{userinfo}{at}{hosts.split(',')[0]}{tail}"
    try:
        options = dict(parse_url(single))
    except ValueError as exc:
        raise ConfigError(f"store.url: {exc}") from None
    if options.pop("db", 0) not in (0, None):
        raise ConfigError("store.url: a Redis Cluster has database 0 only (…/0 or no path)")
    for key in ("host", "port", "path"):
        options.pop(key, None)
    if options.pop("connection_class", None) is not None and scheme == "rediss":
        options["ssl"] = True
    return nodes, options


def _node(part: str) -> tuple[str, int]:
    # urlsplit reads "[::1]:7000" and "host:7000" alike; one node at a time.
    parsed = urlsplit(f"//{part}")
    try:
        port = parsed.port or 6379
    except ValueError:
        raise ConfigError(f"store.url: {part!r} is not host:port") from None
    if not parsed.hostname:
        raise ConfigError(f"store.url: {part!r} is not host:port")
    return parsed.hostname, port


async def refuse_cluster_node(url: str, timeout_s: float = 2.0) -> None:
    """``ConfigError`` if ``url`` is a one-server URL and the server is a cluster node.

    A server that cannot be reached is not refused: the proxy starts on local state
    and shares once it can, as with any outage (and says so in the log)."""
    if url.startswith("memory://") or is_cluster(url):
        return
    client = aioredis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )
    try:
        info = await client.info("cluster")
    except ERRORS as exc:
        log.warning("store not reachable at start-up (%s): not checked", type(exc).__name__)
        return
    finally:
        await client.aclose()
    if str(info.get("cluster_enabled", 0)) == "1":
        raise ConfigError(
            "store.url names one node of a Redis Cluster (INFO cluster: cluster_enabled:1); "
            "use redis+cluster://host:port[,host:port…] so every node's keys are shared"
        )
