"""Output items in Redis (``ItemStore``), so any replica resolves an ``item_reference``
to an answer another one relayed.

Key layout (``tenant`` is the caller's hashed credential; ``id`` the item's, at most
``items.MAX_ID_CHARS``), built in ``item_keys`` alone, so that Cluster hash tags can be
added in one place:

```
{prefix}:item:{tenant}:{id}   string  the item's JSON (Fernet-encrypted when
                                      store.encryption_keys are set), PX = store.ttl_s
{prefix}:items:{tenant}       zset    the tenant's item ids, scored by last use (ms),
                                      PX = store.ttl_s from the tenant's last write
```

A write is one pipelined round trip (the items, their ids in the tenant's index, the
index's expired ids dropped, its size); only a tenant past ``ITEMS_PER_TENANT`` costs a
second, which drops its least recently used items. Not atomic: two replicas writing one
tenant's items at once may keep a few over the bound until its next write. A read is one
round trip: GETEX (the TTL refreshed on use, as snapshots' is; Redis 6.2+) and the id's
score in the index moved to now, per id (not MGET: a Cluster serves keys of several
slots in a pipeline).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

from proxy.errors import StoreError
from proxy.store.codec import SnapshotCipher
from proxy.store.connect import Client
from proxy.store.failures import ERRORS
from proxy.store.items import ITEMS_PER_TENANT, keepable


def item_keys(prefix: str, tenant: str, ids: Sequence[str]) -> tuple[str, list[str]]:
    """The tenant's index key and the key of each of ``ids``: the one place they are built."""
    return f"{prefix}:items:{tenant}", [f"{prefix}:item:{tenant}:{i}" for i in ids]


class RedisItems:
    def __init__(
        self,
        redis: Client,
        prefix: str,
        ttl_s: float,
        encryption_keys: Sequence[str] = (),
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_ms = max(int(ttl_s * 1000), 1)
        self._cipher = SnapshotCipher(encryption_keys) if encryption_keys else None
        self.per_tenant = ITEMS_PER_TENANT

    async def remember_items(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        kept = [(i, raw) for i, raw in items if keepable(i, raw)]
        if not kept:
            return
        index, keys = item_keys(self._prefix, tenant, [i for i, _ in kept])
        now_ms = int(time.time() * 1000)
        cipher = self._cipher
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, (_, raw) in zip(keys, kept, strict=True):
                    pipe.set(key, cipher.encrypt(raw) if cipher else raw, px=self._ttl_ms)
                pipe.zadd(index, {i: now_ms for i, _ in kept})
                pipe.zremrangebyscore(index, "-inf", now_ms - self._ttl_ms)
                pipe.pexpire(index, self._ttl_ms)
                pipe.zcard(index)
                replies = await pipe.execute()
            over = int(replies[-1]) - self.per_tenant
            if over > 0:
                oldest = cast(list[tuple[bytes, float]], await self._redis.zpopmin(index, over))
                ids = [member.decode() for member, _ in oldest]
                await self._redis.delete(*item_keys(self._prefix, tenant, ids)[1])
        except ERRORS as exc:
            raise StoreError(f"redis item save failed: {type(exc).__name__}") from exc

    async def recall_items(self, tenant: str, ids: Sequence[str]) -> list[bytes | None]:
        if not ids:
            return []
        index, keys = item_keys(self._prefix, tenant, ids)
        now_ms = int(time.time() * 1000)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.getex(key, px=self._ttl_ms)
                pipe.zadd(index, {i: now_ms for i in ids}, xx=True)
                pipe.pexpire(index, self._ttl_ms)
                replies = await pipe.execute(raise_on_error=False)
        except ERRORS as exc:
            raise StoreError(f"redis item load failed: {type(exc).__name__}") from exc
        return [self._decoded(raw) for raw in replies[: len(keys)]]

    def _decoded(self, raw: object) -> bytes | None:
        """An item's JSON; None for nothing, a wrong type, or what no key decrypts."""
        if not isinstance(raw, bytes):
            return None
        if self._cipher is None or raw.startswith(b"{"):
            return raw
        try:
            return self._cipher.decrypt(raw)
        except StoreError:
            return None
