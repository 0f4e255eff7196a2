"""A session's archive of originals in Redis (``store/archive.py`` says what is kept and
how it is bounded), so every replica recalls from what any of them archived.

```
{prefix}:arch:{key}             list    the session's originals, oldest first, each its
                                        JSON (Fernet-encrypted under store.encryption_keys);
                                        PX = store.ttl_s, refreshed with its snapshot's
{prefix}:arch-bytes:{tenant}    hash    session storage key -> bytes its list holds
{prefix}:arch-age:{tenant}      zset    session storage key, scored by its last write (ms)
```

On a cluster the list carries the session's hash tag (``keys.py``), so it shares its
snapshot's slot and one ``DEL`` removes both. A write is one script on the list (append,
then drop its oldest past the session's bound, atomically) and one pipelined round trip
on the tenant's two keys; only a tenant past its bound costs one more, which deletes its
least recently archived sessions' lists. The tenant's part is not atomic: two replicas
archiving one tenant's sessions at once may keep a little over the bound until its next
write. A tenant's entries outlive lists that expired, until the bound reaches them:
they are the oldest, so they go first, freeing nothing live.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from proxy.core.passages import Original
from proxy.core.session import SessionKey
from proxy.errors import StoreError
from proxy.store import lua
from proxy.store.codec import SnapshotCipher, decode_original, encode_original
from proxy.store.connect import Client
from proxy.store.failures import ERRORS
from proxy.store.keys import KeyLayout
from proxy.store.protocols import Dropped

# Archived messages decoded (and decrypted) on the event loop; more go to a thread.
_INLINE_ENTRIES = 8


class RedisArchive:
    def __init__(
        self,
        redis: Client,
        keys: KeyLayout,
        ttl_ms: int,
        cipher: SnapshotCipher | None,
        bounds: tuple[int, int],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_ms = ttl_ms
        self._cipher = cipher
        self._session_bytes, self._tenant_bytes = bounds
        self._append = redis.register_script(lua.ARCHIVE)
        self.unreadable = 0  # entries no key decrypts (or refused plaintext), skipped

    def _tenant_keys(self, tenant: str) -> tuple[str, str]:
        prefix = self._keys.prefix
        return f"{prefix}:arch-bytes:{tenant}", f"{prefix}:arch-age:{tenant}"

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        if not originals:
            return Dropped()
        name = self._keys.session("arch", key)
        entries = [encode_original(o, self._cipher) for o in originals]
        sizes, ages = self._tenant_keys(key.tenant)
        member = key.storage_key
        try:
            kept, dropped = await self._append(
                keys=[name], args=[self._session_bytes, self._ttl_ms, *entries]
            )
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(sizes, member, int(kept))
                pipe.zadd(ages, {member: int(time.time() * 1000)})
                pipe.pexpire(sizes, self._ttl_ms)
                pipe.pexpire(ages, self._ttl_ms)
                pipe.hgetall(sizes)
                pipe.zrange(ages, 0, -1)
                *_, held, order = await pipe.execute()
            return Dropped(int(dropped), await self._bounded(key, held, order))
        except ERRORS as exc:
            raise StoreError(f"redis archive failed: {type(exc).__name__}") from exc

    async def _bounded(self, key: SessionKey, held: dict[bytes, bytes], order: list[bytes]) -> int:
        """Delete the tenant's least recently archived sessions' lists (never ``key``'s)
        while it holds more than its bound; the bytes they held."""
        total = sum(int(v) for v in held.values())
        if total <= self._tenant_bytes:
            return 0
        own, victims, freed = key.storage_key.encode(), [], 0
        for member in order:
            if total - freed <= self._tenant_bytes:
                break
            if member != own:
                victims.append(member)
                freed += int(held.get(member, 0))
        if not victims:
            return 0
        sizes, ages = self._tenant_keys(key.tenant)
        names = []
        for member in victims:
            victim = SessionKey.from_storage_key(member.decode())
            if victim is not None:
                names.append(self._keys.session("arch", victim))
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:  # each in its own slot on a cluster: one DEL apiece
                pipe.delete(name)
            pipe.hdel(sizes, *victims)
            pipe.zrem(ages, *victims)
            await pipe.execute()
        return freed

    async def load_archive(self, key: SessionKey) -> list[Original]:
        name = self._keys.session("arch", key)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.lrange(name, 0, -1)
                pipe.pexpire(name, self._ttl_ms)
                raw, _ = await pipe.execute()
        except ERRORS as exc:
            raise StoreError(f"redis archive load failed: {type(exc).__name__}") from exc
        if len(raw) > _INLINE_ENTRIES:  # decrypting and parsing megabytes: off the loop
            return await asyncio.to_thread(self._decoded, raw)
        return self._decoded(raw)

    def _decoded(self, raw: list[bytes]) -> list[Original]:
        out = []
        for entry in raw:
            original = decode_original(entry, self._cipher)
            if original is None:
                self.unreadable += 1
                continue
            out.append(original)
        return out

    async def forget(self, key: SessionKey) -> None:
        """Drop ``key`` from its tenant's accounting (its list is deleted with its snapshot)."""
        sizes, ages = self._tenant_keys(key.tenant)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hdel(sizes, key.storage_key)
            pipe.zrem(ages, key.storage_key)
            await pipe.execute()
