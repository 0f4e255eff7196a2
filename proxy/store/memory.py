"""The embedded store: dicts in this process, expired entries dropped as it goes.

Each dict is kept in expiry order (an entry is moved to the end whenever its
deadline is pushed back), so what has expired sits at the front and is popped
from there on every write: amortised O(1), and memory stays bounded by what is
live. ``OrderedDict`` because popping the front of a plain dict leaves holes
that every later ``next(iter(...))`` scans past.

Sessions are bounded twice: ``max_sessions`` in all, and ``max_per_tenant`` for
any one tenant, whose own least recently used session goes when it would pass
it. Without the second bound one caller creating sessions would push every other
tenant's snapshots out of a shared store. The sessions' sightings (what
``GET /sessions/{id}`` reads before a first compaction) are bounded the same way,
each tenant's apart.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from proxy.core.passages import Original
from proxy.core.session import SessionKey
from proxy.core.snapshot import Snapshot
from proxy.store.archive import SESSION_BYTES, TENANT_BYTES, MemoryArchive
from proxy.store.health import Health
from proxy.store.protocols import Dropped, Sighting

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


def _drop_expired(
    entries: OrderedDict[_K, tuple[float, _V]],
    now: float,
    dropped: Callable[[_K], None] | None = None,
) -> None:
    # Entries with a shorter TTL than the front one wait behind it: at most one
    # longest TTL's worth of writes, never an unbounded backlog.
    while entries:
        key = next(iter(entries))
        if entries[key][0] >= now:
            return
        del entries[key]
        if dropped is not None:
            dropped(key)


class _Tenants:
    """Each tenant's keys in one bounded dict, least recently used first (that dict's
    order, per tenant): which key goes to make room for a new one."""

    __slots__ = ("limit", "own")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.own: dict[str, OrderedDict[SessionKey, None]] = {}

    def victim(
        self, key: SessionKey, entries: OrderedDict[SessionKey, Any], total: int
    ) -> SessionKey | None:
        """The key to drop before ``key`` (not in ``entries``) is added, or None: the
        tenant's own least recently used at its limit, else the oldest of all at ``total``."""
        own = self.own.get(key.tenant)
        if own is not None and len(own) >= self.limit:
            return next(iter(own))
        if len(entries) >= total:
            return next(iter(entries))
        return None

    def touch(self, key: SessionKey) -> None:
        own = self.own.setdefault(key.tenant, OrderedDict())
        own[key] = None
        own.move_to_end(key)

    def remove(self, key: SessionKey) -> None:
        own = self.own[key.tenant]
        del own[key]
        if not own:
            del self.own[key.tenant]


class MemoryStore:
    def __init__(
        self,
        ttl_s: float,
        max_sessions: int = 100_000,
        *,
        max_per_tenant: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        archive_bounds: tuple[int, int] = (SESSION_BYTES, TENANT_BYTES),
    ) -> None:
        self._ttl = ttl_s
        self._max = max_sessions
        per_tenant = max_sessions if max_per_tenant is None else max_per_tenant
        self._clock = clock
        self._data: OrderedDict[SessionKey, tuple[float, Snapshot]] = OrderedDict()
        self._tenants = _Tenants(per_tenant)  # the sessions of _data, per tenant
        self._locks: OrderedDict[SessionKey, tuple[float, str]] = OrderedDict()
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._seen: OrderedDict[SessionKey, tuple[float, Sighting]] = OrderedDict()
        self._seen_tenants = _Tenants(per_tenant)  # the sightings of _seen, per tenant
        self._archive = MemoryArchive(ttl_s, *archive_bounds, clock=clock)

    async def load(self, key: SessionKey) -> Snapshot | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        expires, snapshot = entry
        now = self._clock()
        if expires < now:
            self._forget(key)
            return None
        # Refreshed on use, like Redis; moved to the end so the front stays the
        # soonest to expire and the least recently used.
        self._data[key] = (now + self._ttl, snapshot)
        self._data.move_to_end(key)
        self._tenants.touch(key)
        self._archive.touch(key)
        return snapshot

    async def load_many(self, keys: Sequence[SessionKey]) -> list[Snapshot | None]:
        return [await self.load(k) for k in keys]

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        current = await self.load(key)
        if (current.version if current else 0) != snapshot.version - 1:
            return False
        self._keep(key, snapshot)
        return True

    async def newest(
        self, keys: Sequence[SessionKey], loaded: Sequence[Snapshot | None]
    ) -> list[Snapshot | None]:
        """Per key, the newer of ``loaded`` (what a shared store answered while it refused
        writes: ResilientStore) and what this store holds, which then keeps the newer:
        a summary saved on top of either is saved here."""
        newest: list[Snapshot | None] = []
        for key, theirs in zip(keys, loaded, strict=True):
            mine = await self.load(key)
            if theirs is not None and (mine is None or mine.version < theirs.version):
                self._keep(key, theirs)
            newest.append(
                mine if mine and (theirs is None or mine.version > theirs.version) else theirs
            )
        return newest

    def _keep(self, key: SessionKey, snapshot: Snapshot) -> None:
        now = self._clock()
        _drop_expired(self._data, now, self._tenants.remove)
        if key not in self._data:
            victim = self._tenants.victim(key, self._data, self._max)
            if victim is not None:
                self._forget(victim)
        self._data[key] = (now + self._ttl, snapshot)
        self._data.move_to_end(key)
        self._tenants.touch(key)

    async def delete(self, key: SessionKey) -> bool:
        seen = self._seen.pop(key, None) is not None
        if seen:
            self._seen_tenants.remove(key)
        seen = self._archive.forget(key) or seen
        if key not in self._data:
            return seen
        self._forget(key)
        return True

    async def note_seen(self, key: SessionKey, sighting: Sighting) -> None:
        now = self._clock()
        _drop_expired(self._seen, now, self._seen_tenants.remove)
        if key not in self._seen:
            # Bounded like sessions, per tenant too: one tenant's flood of new sessions
            # drops its own oldest sightings, never another tenant's.
            victim = self._seen_tenants.victim(key, self._seen, self._max)
            if victim is not None:
                del self._seen[victim]
                self._seen_tenants.remove(victim)
        self._seen[key] = (now + self._ttl, sighting)
        self._seen.move_to_end(key)
        self._seen_tenants.touch(key)

    async def load_seen(self, key: SessionKey) -> Sighting | None:
        entry = self._seen.get(key)
        if entry is None or entry[0] < self._clock():
            return None
        return entry[1]

    def _forget(self, key: SessionKey) -> None:
        del self._data[key]
        self._tenants.remove(key)
        self._archive.forget(key)  # what the snapshot replaced goes with it

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        return await self._archive.archive(key, originals)

    async def load_archive(self, key: SessionKey) -> list[Original]:
        return await self._archive.load_archive(key)

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        now = self._clock()
        held = self._locks.get(key)
        if held is not None and held[0] > now:
            return None
        _drop_expired(self._locks, now)
        token = secrets.token_hex(8)
        self._locks[key] = (now + ttl_s, token)
        self._locks.move_to_end(key)
        return token

    async def release(self, key: SessionKey, token: str) -> None:
        held = self._locks.get(key)
        if held is not None and held[1] == token:
            del self._locks[key]

    async def load_window(self, key: str) -> int | None:
        entry = self._windows.get(key)
        if entry is None or entry[0] < self._clock():
            return None
        return entry[1]

    async def save_window(self, key: str, tokens: int, ttl_s: float) -> None:
        now = self._clock()
        _drop_expired(self._windows, now)
        if key not in self._windows and len(self._windows) >= self._max:
            self._windows.popitem(last=False)  # one per tenant and model: bounded like sessions
        self._windows[key] = (now + ttl_s, tokens)
        self._windows.move_to_end(key)

    async def list_sessions(self, limit: int) -> list[tuple[SessionKey, Snapshot]]:
        now = self._clock()
        data = self._data.items()
        live = ((k, snap) for k, (expires, snap) in data if expires >= now and not k.shadow)
        return [entry for _, entry in zip(range(limit), live, strict=False)]

    @property
    def one_server(self) -> bool:
        return True

    async def ping(self) -> bool:
        return True

    async def probe(self) -> None:
        return None

    async def health(self) -> Health:
        return Health()

    async def aclose(self) -> None:
        self._data.clear()
        self._tenants.own.clear()
        self._seen_tenants.own.clear()
        self._locks.clear()
        self._windows.clear()
        self._seen.clear()
        self._archive.clear()
