"""Counters that expire (``Quota``): what a tenant's caps count (compaction/caps.py).

In Redis when the store is Redis, so every replica and worker counts against one total:
``{prefix}:quota:{name}``, a string INCRBY'd and given its TTL in one pipelined round
trip (one key: a Cluster serves it from its slot). In this process for ``memory://``
(each worker its own), bounded like the other tables. ``StoreError`` when Redis fails,
and at once, Redis untried, while the store is in its outage cool-down (a stalled Redis
would otherwise make every capped summary wait out its timeouts): the caller decides
what a failed count means.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from proxy.errors import StoreError
from proxy.store.failures import ERRORS

if TYPE_CHECKING:
    from proxy.config import Settings
    from proxy.store.connect import Client
    from proxy.store.protocols import Store

MAX_COUNTERS = 100_000  # in this process: a tenant's hour and day, for many tenants


class Quota(Protocol):
    async def add(self, name: str, amount: int, ttl_s: float) -> int:
        """``name``'s total after adding ``amount`` (0: read it); it expires ``ttl_s``
        after a write (its name holds the hour or day it counts, so nothing outlives it)."""
        ...


class MemoryQuota:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._counters: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._clock = clock

    async def add(self, name: str, amount: int, ttl_s: float) -> int:
        now = self._clock()
        expires, total = self._counters.get(name, (now + ttl_s, 0))
        if expires <= now:
            expires, total = now + ttl_s, 0
        if amount:
            total += amount
            self._counters[name] = (expires, total)
            self._counters.move_to_end(name)
            if len(self._counters) > MAX_COUNTERS:
                self._counters.popitem(last=False)
        return total


class RedisQuota:
    def __init__(
        self, redis: Client, prefix: str, cooling: Callable[[], bool] = lambda: False
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._cooling = cooling  # the store's outage cool-down (ResilientStore.degraded)

    async def add(self, name: str, amount: int, ttl_s: float) -> int:
        if self._cooling():
            raise StoreError("redis quota not tried: the store is in its outage cool-down")
        key = f"{self._prefix}:quota:{name}"
        try:
            if not amount:
                raw = await self._redis.get(key)
                return int(raw or 0)
            pipe = self._redis.pipeline(transaction=False)
            pipe.incrby(key, amount)
            pipe.expire(key, max(1, int(ttl_s)))  # its name holds its hour or day
            total, _ = await pipe.execute()
            return int(total)
        except (*ERRORS, ValueError) as exc:
            raise StoreError(f"redis quota failed: {type(exc).__name__}") from exc


def build_quota(settings: Settings, store: Store) -> Quota:
    """Counters on ``store``'s backend: Redis when it is a Redis one, else this process."""
    from proxy.store.resilient import ResilientStore

    if isinstance(store, ResilientStore):
        from proxy.store.redis import RedisStore

        if isinstance(store.remote, RedisStore):
            return RedisQuota(store.remote.client, settings.store.prefix, lambda: store.degraded)
    return MemoryQuota()
