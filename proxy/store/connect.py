"""The Redis client a ``store.url`` names, and what start-up checks of it.

```
redis://  rediss://  unix://           one server: redis-py's Redis on a blocking pool
redis+cluster://h:p[,h:p…][/0]         a Redis Cluster (cluster.py): redis-py's asyncio
rediss+cluster://…                     RedisCluster, started from every node named
redis+sentinel://h:p[,h:p…]/svc[/db]   the primary Sentinel names (sentinel.py),
rediss+sentinel://…                    followed through failovers
```

``open_redis`` is the one place a URL becomes a client: one branch per topology.

A plain URL that reaches a cluster node would work for the keys that node happens to
own and fail every other one with ``MOVED``: each replica would then summarize every
session itself while the store looks reachable. ``refuse_cluster_node`` (start-up and
``check-config``) turns that into a refusal naming ``redis+cluster://``.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from proxy.errors import ConfigError
from proxy.store.cluster import open_cluster
from proxy.store.sentinel import is_sentinel_url, sentinel_client

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
        return open_cluster(url, timeout_s, places=_POOL_SIZE, wait_s=_POOL_WAIT_S)
    # Blocking: a call that finds every connection busy waits for one. The default
    # pool fails it at once, and a burst of turns would take this replica off Redis
    # (ResilientStore) with nothing wrong with Redis.
    pool = dict(
        max_connections=_POOL_SIZE,
        timeout=_POOL_WAIT_S,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=30,
        retry_on_timeout=False,
    )
    if is_sentinel_url(url):
        return sentinel_client(url, pool)
    blocking = aioredis.BlockingConnectionPool.from_url(url, **pool)
    return aioredis.Redis(connection_pool=blocking)


async def close_redis(client: Client) -> None:
    """Close ``client`` and its connections (the pool is the store's, not shared)."""
    if isinstance(client, RedisCluster):
        await client.aclose()
    else:
        await client.aclose(close_connection_pool=True)


async def refuse_cluster_node(url: str, timeout_s: float = 2.0) -> None:
    """``ConfigError`` if ``url`` is a one-server URL and the server is a cluster node.

    A server that cannot be reached (or will not say) is not refused: the proxy starts
    on local state and shares once it can, as with any outage, and logs that it could
    not check."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return  # memory://, or a topology whose client knows what it talks to
    client = aioredis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )
    try:
        info = await client.info("cluster")
    except ERRORS as exc:
        log.warning("store not checked at start-up (%s)", type(exc).__name__)
        return
    finally:
        await client.aclose()
    if str(info.get("cluster_enabled", 0)) == "1":
        raise ConfigError(
            "store.url names one node of a Redis Cluster (INFO cluster: cluster_enabled:1); "
            "use redis+cluster://host:port[,host:port…] so every node's keys are shared"
        )
