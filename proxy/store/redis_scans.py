"""Whole-store scans of a Redis store, for the admin listing and check-config: off every
request's path, and skipping (as a load would treat as absent) what they cannot read.
On a cluster a scan walks every primary (redis-py's ``scan_iter`` keeps a cursor per
node) and each read goes to the key's own node."""

from __future__ import annotations

from redis.exceptions import ResponseError

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
from proxy.store.connect import Client
from proxy.store.failures import ERRORS
from proxy.store.keys import KeyLayout


async def list_sessions(
    redis: Client, keys: KeyLayout, cipher: SnapshotCipher | None, limit: int
) -> list[tuple[SessionKey, Snapshot]]:
    """Up to ``limit`` readable snapshots of the store ``keys`` lays out."""
    out: list[tuple[SessionKey, Snapshot]] = []
    try:
        async for name in redis.scan_iter(match=f"{keys.snapshots()}*", count=500):
            key = keys.session_of(name.decode())
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
    except ERRORS as exc:
        raise StoreError(f"redis scan failed: {type(exc).__name__}") from exc
    return out


async def learned_windows(redis: Client, keys: KeyLayout) -> dict[str, int]:
    """Every learned window of the store ``keys`` lays out: its key -> tokens."""
    prefix = keys.windows()
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
    except ERRORS as exc:
        raise StoreError(f"redis scan failed: {type(exc).__name__}") from exc
    return out
