"""The client of a Redis Cluster: ``redis+cluster://`` and ``rediss+cluster://`` URLs.

```
redis+cluster://[user:password@]host:port[,host:port…][/0][?option=value…]
```

Every node named is a startup node (any one reachable is enough: the client reads the
slot map from it and follows slots as they move); credentials and query options are
read as redis-py reads a ``redis://`` URL's, and ``rediss+`` means TLS. A cluster has
database 0 only.

The client is redis-py's asyncio ``RedisCluster``, with one change: its connection
pools fail a call at once (``MaxConnectionsError``) when every connection to a node is
busy, where the one-server store's pool makes it wait. A burst of turns would then take
a replica off Redis (``ResilientStore``) with nothing wrong with Redis, so calls here
wait for one of ``places`` (each holds at most one connection per node) for up to
``wait_s`` instead. And the slot map is read before the first call, not by each of a
burst of first calls at once (``QueuedCluster.place``); a primary that goes down fails
the calls to its own slots only (``_CommandTable``). ``keys_per_primary`` finds the
readiness probe a key on each primary: a write to one key shows one primary only.
"""

from __future__ import annotations

import asyncio
import binascii
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import SlotNotCoveredError

from proxy.errors import ConfigError
from proxy.store.failures import ERRORS
from proxy.store.health import ProbeFailed

# Set while a task holds a place: a pipeline that retries a redirected command through
# the client must not wait for a second one (it could wait on itself).
_holding: ContextVar[bool] = ContextVar("cluster_place_held", default=False)


@cache
def slot_tags() -> tuple[int, ...]:
    """For each slot, the least ``n`` whose digits hash to it: a key whose hash tag is
    ``{n}`` lands in that slot, so any primary, whichever slots it owns, has a probe key.
    Every slot is reached only past n = 100,000, too many CRCs for the event loop: made
    once per process, in a thread (``keys_per_primary``)."""
    tags = [-1] * REDIS_CLUSTER_HASH_SLOTS
    left, n = REDIS_CLUSTER_HASH_SLOTS, 0
    while left:
        # redis.crc.key_slot of a key tagged {n}, without the search for the braces.
        slot = binascii.crc_hqx(b"%d" % n, 0) % REDIS_CLUSTER_HASH_SLOTS
        if tags[slot] < 0:
            tags[slot] = n
            left -= 1
        n += 1
    return tuple(tags)


class QueuedCluster(RedisCluster):
    """``RedisCluster`` whose calls queue for a free place instead of failing at once."""

    def __init__(self, places: int, wait_s: float, **options: Any) -> None:
        super().__init__(max_connections=places, **options)
        self.commands_parser = _CommandTable()
        self._places = asyncio.Semaphore(places)
        self._wait_s = wait_s
        # The slot map the probe's keys were found for, and the keys (keys_per_primary).
        self._probe_keys: tuple[dict[int, Any], dict[str, str]] | None = None
        self._slot_tags: tuple[int, ...] | None = None

    @asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """Hold one place for a call; ``ConnectionError`` after waiting ``wait_s``."""
        if _holding.get():
            yield
            return
        try:
            await asyncio.wait_for(self._places.acquire(), self._wait_s)
        except TimeoutError:
            raise RedisConnectionError("every connection to the cluster is busy") from None
        held = _holding.set(True)
        try:
            if self._initialize:
                # The slot map first, read once while the others wait: calls that start
                # before it is known go to one node and draw MOVED, and every fifth
                # MOVED makes redis-py close the connections other calls are using.
                await self.initialize()
            yield
        except AttributeError as exc:
            # A connection closed under this call by such a refresh (its writer gone).
            raise RedisConnectionError("connection closed by a slot map refresh") from exc
        finally:
            _holding.reset(held)
            self._places.release()

    async def keys_per_primary(self, key: Callable[[int], str]) -> dict[str, str]:
        """For each primary that owns slots (by its ``host:port``), a key ``key(n)`` that
        hashes to one of its slots, ``key`` making ``n`` its hash tag: the readiness
        probe writes one to each. Chosen again only when the slot map changed under the
        last ones chosen."""
        async with self.place():
            pass  # the slot map read first, as for any call
        if self._slot_tags is None:
            self._slot_tags = await asyncio.to_thread(slot_tags)
        slots = self.nodes_manager.slots_cache
        found = self._probe_keys
        if found is None or found[0] is not slots or not self._still_owned(found[1]):
            keys: dict[str, str] = {}
            for slot, nodes in slots.items():
                if nodes and nodes[0].name not in keys:
                    keys[nodes[0].name] = key(self._slot_tags[slot])
            found = self._probe_keys = (slots, keys)
        return found[1]

    async def probe_primaries(self, key: Callable[[int], str]) -> None:
        """The readiness probe: ``SET key(n) 1 PX 10000`` on every primary at once
        (``keys_per_primary``); ``ProbeFailed`` naming those that refused or did not
        answer, raised from the first one's error; ``SlotNotCoveredError`` if some slots
        have no primary in the slot map."""
        names = await self.keys_per_primary(key)
        covered = len(self.nodes_manager.slots_cache)
        if covered < REDIS_CLUSTER_HASH_SLOTS:  # slots no primary serves: none to probe
            raise SlotNotCoveredError(f"{covered} of {REDIS_CLUSTER_HASH_SLOTS} slots served")
        done = await asyncio.gather(
            *(self.set(name, "1", px=10_000) for name in names.values()), return_exceptions=True
        )
        failed = [(node, e) for node, e in zip(names, done, strict=True) if e is not True]
        for _, error in failed:
            if isinstance(error, BaseException) and not isinstance(error, ERRORS):
                raise error  # not the store's answer: cancelled, or a bug
        if failed:
            first = failed[0][1]
            cause = first if isinstance(first, BaseException) else None
            nodes = [node for node, _ in failed]
            # Every primary has a key (slot_tags reaches every slot): names counts them.
            message = f"redis probe failed on {len(nodes)}/{len(names)} primaries"
            detail = type(first).__name__ if cause else "not written"
            raise ProbeFailed(f"{message}: {detail}", nodes, len(names)) from cause

    def _still_owned(self, keys: dict[str, str]) -> bool:
        slots = self.nodes_manager.slots_cache
        return all(
            (owner := slots.get(self.keyslot(name))) and owner[0].name == node
            for node, name in keys.items()
        )

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.place():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint or transaction:
            return super().pipeline(transaction, shard_hint)  # refused by redis-py
        # redis-py's stubs leave an attribute abstract that its own ClusterPipeline sets.
        return _QueuedPipeline(self)  # type: ignore[abstract]


class _CommandTable(AsyncCommandsParser):
    """redis-py's table of commands (where each one's keys are), read once. redis-py reads
    it again from the first primary on every refresh of the slot map: with that primary
    down, every refresh failed, and with it every call, to the other primaries too."""

    async def initialize(self, node: ClusterNode | None = None) -> None:
        if not self.commands:
            await super().initialize(node)
        elif node is not None:
            self.node = node


class _QueuedPipeline(ClusterPipeline):
    def __init__(self, client: QueuedCluster) -> None:
        super().__init__(client)
        self._queued_client = client

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        async with self._queued_client.place():
            return await super().execute(raise_on_error, allow_redirections)


def open_cluster(url: str, timeout_s: float, places: int, wait_s: float) -> QueuedCluster:
    """The client of the cluster ``url`` names, each call bounded by ``timeout_s``."""
    nodes, options = parse_cluster_url(url)
    try:
        return QueuedCluster(
            places,
            wait_s,
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
            # One more try after a node fails or a slot moves (the client re-reads the
            # slot map first), not redis-py's three with back-off: a call stays short.
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=1),
            **options,
        )
    except TypeError as exc:  # a query parameter no client option has
        raise ConfigError(f"store.url: {exc}") from None


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
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
    for key in ("host", "port", "path", "connection_class"):
        options.pop(key, None)
    if scheme == "rediss":
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
