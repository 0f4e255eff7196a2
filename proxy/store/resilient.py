"""A remote store that degrades instead of failing requests.

A call that fails with ``StoreError`` (Redis down, slow, a read-only replica, full)
is served from this replica's own in-process store instead; every failure is counted
by kind, every call served locally too, and the store reads as failing until a write
it performed shows it takes writes again (``health.StoreWatch``: which writes prove
that, which failures leave the store untried for a cool-down, so no request waits on a
dead server more than once per cool-down; what is logged). Reconnection needs no
restart. While failing, a snapshot this replica saved locally wins over an older one
the store still answers with (a replica's or a full Redis's reads go on), and what the
store answered or took is kept locally too, so a cool-down (or a primary down, on a
cluster) does not send a session back to an older snapshot. ``/readyz`` asks
``health``, which probes with a write (``watched.py``: a PING would pass). This is the
one place a store outage becomes "no snapshot".

A summarization lock taken in Redis is always released there, outage or not: a lock
left behind would make the session's next turns wait for a holder that is long gone.
A release that fails is retried in the background (a few attempts with backoff, never
past the lock's own expiry); this replica's next ``acquire`` of it settles it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.core.session import SessionKey
from proxy.core.snapshot import Snapshot
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store.health import COOLDOWN_S as COOLDOWN_S  # re-exported: tests' clocks
from proxy.store.health import LOG_INTERVAL_S as LOG_INTERVAL_S
from proxy.store.health import Reports
from proxy.store.memory import MemoryStore
from proxy.store.protocols import Remote, Sighting
from proxy.store.watched import WatchedRemote, always_written, written

log = logging.getLogger("proxy.store")

# Pauses before each background retry of a failed lock release (~16 s in all).
RELEASE_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# Leases of locks that were never released (a caller bug) are dropped past this many.
_LEASE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class _Lease:
    """A lock this replica holds in the remote store, and when it expires there."""

    key: SessionKey
    expires: float


class ResilientStore(WatchedRemote):
    def __init__(
        self,
        remote: Remote,
        local: MemoryStore,
        metrics: Metrics,
        *,
        release_backoff_s: Sequence[float] = RELEASE_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(remote, local, metrics, clock)
        self._metrics = metrics
        self._clock = clock
        self._release_backoff_s = tuple(release_backoff_s)
        # Owner token -> lease, for locks taken in the remote store.
        self._leases: dict[str, _Lease] = {}
        # Session key -> owner token whose remote release is still owed.
        self._owed: dict[SessionKey, str] = {}
        # Owner token -> the background task retrying its release.
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._reports = Reports(clock)

    async def load(self, key: SessionKey) -> Snapshot | None:
        loaded = await self._call(
            "load", lambda: self.remote.load(key), lambda: self.local.load(key)
        )
        return (await self._newest([key], [loaded]))[0]

    async def load_many(self, keys: Sequence[SessionKey]) -> list[Snapshot | None]:
        remote, local = self.remote, self.local
        loaded = await self._call(
            "load", lambda: remote.load_many(keys), lambda: local.load_many(keys)
        )
        return await self._newest(keys, loaded)

    async def _newest(
        self, keys: Sequence[SessionKey], loaded: list[Snapshot | None]
    ) -> list[Snapshot | None]:
        """While the store fails, what this replica saved meanwhile (kept only locally)
        where it is newer than what the store answered; the local state keeps the newer."""
        if self._watch.cause is None:
            return loaded
        newest = await self.local.newest(keys, loaded)
        if newest != loaded:
            self._watch.fell_back("load")
        return newest

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        if not self.degraded:
            with contextlib.suppress(StoreError):
                # False: the compare-and-swap lost, nothing written.
                if await self._tried("save", self.remote.save(key, snapshot), written):
                    if self._watch.cause is not None:
                        # Kept here too: a cool-down next serves this session from here.
                        await self.local.newest([key], [snapshot])
                    return True
                if self._watch.cause is None:
                    return False  # a concurrent writer's snapshot is as good as this one
                # Failing: the store refused this replica's last writes, so it is behind
                # the chain kept here, and loses every compare-and-swap on it.
        self._watch.fell_back("save")
        return await self.local.save(key, snapshot)

    async def delete(self, key: SessionKey) -> bool:
        await self.local.delete(key)
        # Not a proof of writes whatever it deleted: a full Redis still deletes.
        return await self._call(
            "delete", lambda: self.remote.delete(key), lambda: self.local.delete(key)
        )

    async def note_seen(self, key: SessionKey, sighting: Sighting) -> None:
        await self._call(
            "note_seen",
            lambda: self.remote.note_seen(key, sighting),
            lambda: self.local.note_seen(key, sighting),
            always_written,
        )

    async def load_seen(self, key: SessionKey) -> Sighting | None:
        return await self._read(
            "load_seen", lambda: self.remote.load_seen(key), lambda: self.local.load_seen(key)
        )

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        if not self.degraded and key in self._owed:
            # This replica's summary of the session is over; only its release was
            # late. Settle it now rather than wait for a lock nobody holds.
            await self._release_remote(key, self._owed[key])
        if not self.degraded:
            with contextlib.suppress(StoreError):
                token = await self._tried("acquire", self.remote.acquire(key, ttl_s), written)
                if token is not None:
                    self._lease(key, token, ttl_s)
                return token
        self._watch.fell_back("acquire")
        return await self.local.acquire(key, ttl_s)

    def _lease(self, key: SessionKey, token: str, ttl_s: float) -> None:
        now = self._clock()
        if len(self._leases) >= _LEASE_LIMIT:
            self._leases = {t: lease for t, lease in self._leases.items() if lease.expires > now}
        self._leases[token] = _Lease(key, now + ttl_s)

    async def release(self, key: SessionKey, token: str) -> None:
        # The lock may have been taken on either side of an outage.
        await self.local.release(key, token)
        lease = self._leases.pop(token, None)
        if lease is None:
            return  # taken from local state: nothing was locked remotely
        # Attempted even while degraded: skipping it leaves the session locked.
        self._owed[key] = token
        try:
            released = not self.degraded and await self._release_remote(key, token)
        except asyncio.CancelledError:
            self._retry_release(key, token, lease.expires)
            raise
        if not released:
            self._retry_release(key, token, lease.expires)

    async def _release_remote(self, key: SessionKey, token: str) -> bool:
        """One attempt; True when the remote lock is gone (or was not ours any more)."""
        try:
            await self._tried("release", self.remote.release(key, token))
        except StoreError:
            return False
        if self._owed.get(key) == token:
            del self._owed[key]
        retry = self._retries.get(token)
        if retry is not None:
            retry.cancel()  # settled: it counts itself as released
        return True

    def _retry_release(self, key: SessionKey, token: str, expires: float) -> None:
        task = asyncio.create_task(self._release_later(key, token, expires))
        self._retries[token] = task
        task.add_done_callback(lambda _: self._retries.pop(token, None))

    async def _release_later(self, key: SessionKey, token: str, expires: float) -> None:
        outcome = "gave_up"
        try:
            for pause in self._release_backoff_s:
                if self._clock() + pause >= expires:
                    outcome = "expired"  # the lock is gone by itself
                    break
                await asyncio.sleep(pause)
                try:
                    await self._tried("release", self.remote.release(key, token))
                except StoreError:
                    continue  # counted: every failure is
                outcome = "released"
                break
        except asyncio.CancelledError:
            # Either a later acquire of this session settled the release, or shutdown.
            outcome = "released" if self._owed.get(key) != token else "cancelled"
            raise
        finally:
            if self._owed.get(key) == token:
                del self._owed[key]
            self._metrics.lock_release_retries.labels(outcome=outcome).inc()
            self._log_release(key, outcome)

    def _log_release(self, key: SessionKey, outcome: str) -> None:
        extra = self._reports.due("release")
        if extra is None:
            return
        log.warning(
            "summarization lock of session=%s: release failed, retried in the background: %s%s",
            key.log_id,
            outcome,
            extra,
        )

    async def load_window(self, key: str) -> int | None:
        return await self._read(
            "load_window", lambda: self.remote.load_window(key), lambda: self.local.load_window(key)
        )

    async def save_window(self, key: str, tokens: int, ttl_s: float) -> None:
        await self.local.save_window(key, tokens, ttl_s)
        await self._call(
            "save_window",
            lambda: self.remote.save_window(key, tokens, ttl_s),
            lambda: self.local.save_window(key, tokens, ttl_s),
            always_written,
        )

    async def list_sessions(self, limit: int) -> list[tuple[SessionKey, Snapshot]]:
        return await self._call(
            "list_sessions",
            lambda: self.remote.list_sessions(limit),
            lambda: self.local.list_sessions(limit),
        )

    async def aclose(self) -> None:
        await self._stop_probing()
        retries = list(self._retries.values())
        for task in retries:
            task.cancel()
        await asyncio.gather(*retries, return_exceptions=True)
        await self.remote.aclose()
        await self.local.aclose()
