"""Whole-store scans of a Redis store, for the admin listing and check-config: off every
request's path, and skipping (as a load would treat as absent) what they cannot read."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from proxy.core.session import SessionKey
from proxy.core.snapshot import Snapshot
from proxy.errors import StoreError
from proxy.store.codec import (
    NewerFormat,
    SnapshotCipher,
    Unreadable,
    decode_snapshot,
    window_tokens,
)


async def list_sessions(
    redis: aioredis.Redis, prefix: str, cipher: SnapshotCipher | None, limit: int
) -> list[tuple[SessionKey, Snapshot]]:
    """Up to ``limit`` readable snapshots under ``prefix`` (``{prefix}:snap:``)."""
    out: list[tuple[SessionKey, Snapshot]] = []
    try:
        async for name in redis.scan_iter(match=f"{prefix}*", count=500):
            key = SessionKey.from_storage_key(name.decode()[len(prefix) :])
            if key is None:
                continue  # not a session key we wrote
            try:
                raw = await redis.hget(name, "d")
                snapshot = decode_snapshot(raw, cipher) if isinstance(raw, bytes) else None
            except (ResponseError, Unreadable, NewerFormat):
                continue
            if snapshot is not None:
                out.append((key, snapshot))
            if len(out) >= limit:
                break
    except RedisError as exc:
        raise StoreError(f"redis scan failed: {type(exc).__name__}") from exc
    return out


async def learned_windows(redis: aioredis.Redis, prefix: str) -> dict[str, int]:
    """Every learned window under ``prefix`` (``{prefix}:win:``): its key -> tokens."""
    out: dict[str, int] = {}
    try:
        async for name in redis.scan_iter(match=f"{prefix}*", count=500):
            try:
                raw = await redis.get(name)
            except ResponseError:
                continue  # not a window we wrote
            tokens = window_tokens(raw) if raw is not None else None
            if tokens is not None:
                out[name.decode()[len(prefix) :]] = tokens
    except RedisError as exc:
        raise StoreError(f"redis scan failed: {type(exc).__name__}") from exc
    return out
