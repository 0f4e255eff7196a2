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
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from proxy.errors import ConfigError
from proxy.store.cluster import open_cluster
from proxy.store.failures import ERRORS
from proxy.store.sentinel import is_sentinel_url, sentinel_client

log = logging.getLogger("proxy.store")

Client = aioredis.Redis | RedisCluster
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")

# A command whose connection failed (the server restarted, a failover closed it) is sent
# once more on a new one after a pause of RECONNECT_BASE_S to twice that, drawn anew
# each time (equal jitter: never less than the floor, never in step): after an outage
# every process's first calls reconnect spread out, not at one instant. Timeouts are
# not retried: a call stays bounded by about twice timeout_s. A command the server ran
# just before its connection dropped may run twice, as on a cluster: the writes are
# compare-and-set or idempotent, and a quota count errs high, on the capped side.
RECONNECT_BASE_S = 0.05


def reconnect_retry() -> Retry:
    """The retry of a standalone or Sentinel client's connections (cluster.py has its own,
    also jittered, for redirections)."""
    backoff = EqualJitterBackoff(cap=2 * RECONNECT_BASE_S, base=RECONNECT_BASE_S)
    return Retry(backoff, retries=1, supported_errors=(RedisConnectionError,))


def is_cluster(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def open_redis(url: str, timeout_s: float, max_connections: int, wait_s: float) -> Client:
    """The client for ``url``, each call bounded by ``timeout_s``, with at most
    ``max_connections`` to each server (a call waits up to ``wait_s`` for a free one);
    the caller closes it."""
    if is_cluster(url):
        return open_cluster(url, timeout_s, places=max_connections, wait_s=wait_s)
    # Blocking: a call that finds every connection busy waits for one. The default
    # pool fails it at once, and a burst of turns would take this replica off Redis
    # (ResilientStore) with nothing wrong with Redis.
    pool = dict(
        max_connections=max_connections,
        timeout=wait_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=30,
        retry_on_timeout=False,
        retry=reconnect_retry(),
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
