"""Snapshots in Redis, so any replica can serve any turn of a session.

Which keys (hash-tagged per session on a cluster) is ``keys.py``; which client a URL makes,
``connect.py``; a snapshot's bytes, encrypted or not, ``codec.py``; the scripts that make
each read-compare-write atomic, ``lua.py``; the session's originals, ``redis_archive.py``.

Snapshots expire after ``store.ttl_s`` without use; every load refreshes the TTL. Writes are
compare-and-swap in one Lua script (version N only over N-1). Locks are released only by
their owner (compare-and-delete), and expire on their own if a replica dies mid-summary.

A stored value this release cannot use (bad bytes, a snapshot encrypted with a key no longer
configured, an older format, a wrong Redis type) reads as "nothing stored" for that session:
counted, logged with a hashed key, and deleted if still what was read, so its next compaction
can write version 1. A newer format's snapshot (a rollout) reads as nothing but is kept. Calls
have a short socket timeout; failures raise ``StoreError``, and the ``resilient`` wrapper
decides what a request does without the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from proxy.core.session import SessionKey
from proxy.core.snapshot import Snapshot
from proxy.errors import ConfigError, StoreError
from proxy.store import lua
from proxy.store import redis_scans as scans
from proxy.store.archive import SESSION_BYTES, TENANT_BYTES
from proxy.store.cluster import QueuedCluster
from proxy.store.codec import (
    NewerFormat,
    SnapshotCipher,
    Unreadable,
    decode_sighting,
    decode_stored,
    encode_sighting,
    encode_snapshot,
    window_tokens,
)
from proxy.store.connect import Client, close_redis, is_cluster, open_redis
from proxy.store.failures import ERRORS
from proxy.store.health import ProbeFailed
from proxy.store.keys import KeyLayout
from proxy.store.protocols import Sighting
from proxy.store.redis_archive import RedisArchive

if TYPE_CHECKING:
    from proxy.observe.metrics import Metrics

log = logging.getLogger("proxy.store")

_LOG_INTERVAL_S = 30.0
_UNREADABLE = "unreadable %s in redis for session=%s (%s); treated as absent and replaced%s"


def _wrong_type(exc: ResponseError) -> bool:
    return "WRONGTYPE" in str(exc)


def log_id(key: str) -> str:
    """A window key's short hash, like SessionKey.log_id, so logs line up."""
    return blake2b(key.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """How a ``RedisStore`` uses its Redis (defaults: ``StoreSettings``'): its keys' prefix,
    each call's timeout, its connections (``store.max_connections``, ``store.pool_wait_s``),
    the keys snapshots are encrypted with (none: in the clear, refused with
    ``require_encryption``, which also makes a snapshot stored in the clear unreadable)."""

    prefix: str = "cp"
    timeout_s: float = 0.25
    max_connections: int = 100
    pool_wait_s: float = 2.0
    encryption_keys: Sequence[str] = ()
    require_encryption: bool = False
    archive_bounds: tuple[int, int] = (SESSION_BYTES, TENANT_BYTES)  # redis_archive.py


class RedisStore:
    def __init__(
        self,
        url: str,
        ttl_s: float,
        options: RedisOptions | None = None,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        options = options or RedisOptions()
        self.metrics = metrics
        self._last_log = -_LOG_INTERVAL_S
        self._suppressed = 0
        keys = options.encryption_keys
        if options.require_encryption and not keys:
            raise ConfigError("store.require_encryption is set but store.encryption_keys is empty")
        plain = not options.require_encryption
        self._cipher = SnapshotCipher(keys, read_plaintext=plain) if keys else None
        self._ttl_ms = max(int(ttl_s * 1000), 1)
        self._redis = open_redis(
            url, options.timeout_s, options.max_connections, options.pool_wait_s
        )
        self._keys = KeyLayout(options.prefix, tagged=is_cluster(url))
        self._cas = self._redis.register_script(lua.CAS)
        self._delete_if_equal = self._redis.register_script(lua.DELETE_IF_EQUAL)
        self._discard_snapshot = self._redis.register_script(lua.DISCARD_SNAPSHOT)
        self._discard_wrong_type = self._redis.register_script(lua.DISCARD_WRONG_TYPE)
        self.archive = RedisArchive(  # the session's originals (store/archive.py)
            self._redis, self._keys, self._ttl_ms, self._cipher, options.archive_bounds
        )

    @property
    def client(self) -> Client:
        """The connection's client, for the items kept beside (redis_items.py)."""
        return self._redis

    def _k(self, kind: str, key: SessionKey) -> str:
        """A session's Redis key, derived from ``SessionKey.storage_key`` only."""
        return self._keys.session(kind, key)

    async def load(self, key: SessionKey) -> Snapshot | None:
        name = self._k("snap", key)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(name, ["v", "d"])
                pipe.pexpire(name, self._ttl_ms)
                pipe.pexpire(self._k("arch", key), self._ttl_ms)  # it lives as long
                (version, raw), *_ = await pipe.execute()
        except ERRORS as exc:
            await self._load_failed(exc, "snapshot", key.log_id, name, "hash")
            return None
        return await self._decoded(key, name, version, raw)

    async def load_many(self, keys: Sequence[SessionKey]) -> list[Snapshot | None]:
        """``load`` of every key in one round trip (a session's slots)."""
        names = [self._k("snap", k) for k in keys]
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for k, name in zip(keys, names, strict=True):
                    pipe.hmget(name, ["v", "d"])
                    pipe.pexpire(name, self._ttl_ms)
                    pipe.pexpire(self._k("arch", k), self._ttl_ms)
                replies = await pipe.execute()
        except ERRORS:  # each key its own way: a wrong type discarded, else StoreError
            return list(await asyncio.gather(*(self.load(k) for k in keys)))
        pairs = zip(keys, names, replies[::3], strict=True)
        return [await self._decoded(k, name, *reply) for k, name, reply in pairs]

    async def _decoded(
        self, key: SessionKey, name: str, version: bytes | None, raw: bytes | None
    ) -> Snapshot | None:
        """The snapshot stored under ``name`` as ``version`` and ``raw``; None for none."""
        if version is None and raw is None:
            return None
        try:
            return decode_stored(version, raw, self._cipher)
        except NewerFormat:
            return None  # a newer release's, mid-rollout: it stays for the replicas that read it
        except Unreadable as exc:
            delete = self._discard_snapshot(keys=[name], args=[version or b"", raw or b""])
            await self._discard("snapshot", key.log_id, str(exc), delete)
            return None

    async def _load_failed(
        self, exc: Exception, kind: str, ident: str, name: str, expected: str
    ) -> None:
        """A load of ``name`` raised ``exc``. A value there of another Redis type than
        ``expected`` is discarded, and the load finds nothing; any other error is the
        store's."""
        if isinstance(exc, ResponseError) and _wrong_type(exc):
            script, reason = self._discard_wrong_type, "wrong redis type"
            await self._discard(kind, ident, reason, script(keys=[name], args=[expected]))
            return
        raise StoreError(f"redis {kind} load failed: {type(exc).__name__}") from exc

    async def _discard(self, kind: str, ident: str, reason: str, delete: Awaitable[object]) -> None:
        """Count and log an unreadable value, and delete it if it is still what was read
        (``delete``: the script call that does, awaited here; failing is harmless)."""
        with contextlib.suppress(*ERRORS):
            await delete
        if self.metrics is not None:
            self.metrics.snapshots_unreadable.labels(kind=kind).inc()
        now = time.monotonic()
        if now - self._last_log < _LOG_INTERVAL_S:
            self._suppressed += 1
            return
        extra = f" ({self._suppressed} more since the last report)" if self._suppressed else ""
        log.warning(_UNREADABLE, kind, ident, reason, extra)
        self._last_log = now
        self._suppressed = 0

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        try:
            done = await self._cas(
                keys=[self._k("snap", key)],
                args=[snapshot.version, encode_snapshot(snapshot, self._cipher), self._ttl_ms],
            )
        except ERRORS as exc:
            raise StoreError(f"redis save failed: {type(exc).__name__}") from exc
        return bool(done)

    async def delete(self, key: SessionKey) -> bool:
        """The session's snapshot, sighting and archive (one slot on a cluster: one DEL)."""
        names = (self._k("snap", key), self._k("seen", key), self._k("arch", key))
        try:
            deleted = bool(await self._redis.delete(*names))
            await self.archive.forget(key)
        except ERRORS as exc:
            raise StoreError(f"redis delete failed: {type(exc).__name__}") from exc
        return deleted

    async def note_seen(self, key: SessionKey, sighting: Sighting) -> None:
        try:
            await self._redis.set(self._k("seen", key), encode_sighting(sighting), px=self._ttl_ms)
        except ERRORS as exc:
            raise StoreError(f"redis note failed: {type(exc).__name__}") from exc

    async def load_seen(self, key: SessionKey) -> Sighting | None:
        try:
            raw = await self._redis.get(self._k("seen", key))
        except ERRORS as exc:
            if isinstance(exc, ResponseError) and _wrong_type(exc):
                return None  # not a value we wrote: the next note replaces it
            raise StoreError(f"redis seen load failed: {type(exc).__name__}") from exc
        return None if raw is None else decode_sighting(raw)

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        token = secrets.token_hex(8)
        try:
            ok = await self._redis.set(self._k("lock", key), token, nx=True, px=int(ttl_s * 1000))
        except ERRORS as exc:
            raise StoreError(f"redis lock failed: {type(exc).__name__}") from exc
        return token if ok else None

    async def release(self, key: SessionKey, token: str) -> None:
        try:
            await self._delete_if_equal(keys=[self._k("lock", key)], args=[token])
        except ERRORS as exc:
            raise StoreError(f"redis unlock failed: {type(exc).__name__}") from exc

    async def load_window(self, key: str) -> int | None:
        name = self._keys.window(key)
        try:
            raw = await self._redis.get(name)
        except ERRORS as exc:
            await self._load_failed(exc, "window", log_id(key), name, "string")
            return None
        if raw is None:
            return None
        tokens = window_tokens(raw)
        if tokens is None:
            delete = self._delete_if_equal(keys=[name], args=[raw])
            await self._discard("window", log_id(key), "not a token count", delete)
        return tokens

    async def save_window(self, key: str, tokens: int, ttl_s: float) -> None:
        try:
            await self._redis.set(self._keys.window(key), tokens, px=int(ttl_s * 1000))
        except ERRORS as exc:
            raise StoreError(f"redis window save failed: {type(exc).__name__}") from exc

    async def list_sessions(self, limit: int) -> list[tuple[SessionKey, Snapshot]]:
        return await scans.list_sessions(self._redis, self._keys, self._cipher, limit)

    async def learned_windows(self) -> dict[str, int]:
        """Every learned window (``windows.window_key`` -> tokens), for check-config."""
        return await scans.learned_windows(self._redis, self._keys)

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except ERRORS:
            return False

    @property
    def one_server(self) -> bool:
        return not isinstance(self._redis, QueuedCluster)

    async def probe(self) -> None:
        try:
            if isinstance(self._redis, QueuedCluster):
                await self._redis.probe_primaries(self._keys.probe)
            else:
                await self._redis.set(self._keys.probe(), "1", px=10_000)
        except ProbeFailed:
            raise
        except ERRORS as exc:
            raise StoreError(f"redis probe failed: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        await close_redis(self._redis)
