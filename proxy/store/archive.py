"""The archive of a session's originals in this process (``MemoryArchive``), and the bounds
every store keeps it within. Redis's own is ``redis_archive.py`` (``RedisStore.archive``),
the one that falls back to this process's while Redis is out ``fallbacks.py``, and
``build_archive`` (the package's) picks the backend the store has; ``MemoryStore`` and
``RedisStore`` delete it with a session.

A session's archive is its originals in the order they were archived (one compaction's
newly covered span after another), kept as long as its snapshot (``store.ttl_s`` from
the last use) and removed with it. Bounded in bytes twice, oldest first: a session's
own (``SESSION_BYTES``) and a tenant's over all its sessions
(``TENANT_BYTES``: its least recently archived sessions' originals go first, never the
session being written). In this process also all of them together
(``MEMORY_BYTES``, the least recently archived session first). What a write dropped is
returned, so the caller counts it (``Dropped``).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.core.passages import Original
from proxy.core.session import SessionKey
from proxy.store.protocols import Dropped

# A session's archive and a tenant's, in bytes: some 1.5M and 48M archived tokens
# encrypted in Redis (README "Nothing is lost" measures an archived token).
SESSION_BYTES = 8 * 1024 * 1024
TENANT_BYTES = 256 * 1024 * 1024
# The embedded store's archives in all: this process's memory, whatever the tenants.
MEMORY_BYTES = 512 * 1024 * 1024
# An original's bookkeeping beside its text, in bytes (as Redis's list entry would be).
_OVERHEAD = 48


def original_bytes(original: Original) -> int:
    """What ``original`` counts against the bounds: its text's UTF-8 and a little more."""
    return len(original.text.encode()) + len(original.tool) + _OVERHEAD


@dataclass(slots=True)
class _Session:
    expires: float
    originals: deque[tuple[int, Original]]
    size: int = 0


class MemoryArchive:
    def __init__(
        self,
        ttl_s: float,
        session_bytes: int,
        tenant_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        total_bytes: int = MEMORY_BYTES,
    ) -> None:
        self._total_bytes = total_bytes
        self._size = 0
        # Every session, least recently archived first.
        self._order: OrderedDict[SessionKey, None] = OrderedDict()
        self._ttl = ttl_s
        self._session_bytes = session_bytes
        self._tenant_bytes = tenant_bytes
        self._clock = clock
        self._sessions: dict[SessionKey, _Session] = {}
        # Per tenant: its sessions, least recently archived first, and their bytes.
        self._tenants: dict[str, OrderedDict[SessionKey, None]] = {}
        self._tenant_size: dict[str, int] = {}

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        now = self._clock()
        session = self._live(key, now)
        if session is None:
            session = self._sessions[key] = _Session(now + self._ttl, deque())
        session.expires = now + self._ttl
        own = self._tenants.setdefault(key.tenant, OrderedDict())
        own[key] = None
        own.move_to_end(key)
        self._order[key] = None
        self._order.move_to_end(key)
        added = 0
        for original in originals:
            size = original_bytes(original)
            session.originals.append((size, original))
            added += size
        session.size += added
        self._size += added
        self._tenant_size[key.tenant] = self._tenant_size.get(key.tenant, 0) + added
        dropped_own = 0
        while session.size > self._session_bytes and session.originals:
            size, _ = session.originals.popleft()
            session.size -= size
            dropped_own += size
        self._tenant_size[key.tenant] -= dropped_own
        self._size -= dropped_own
        dropped_other = 0
        while self._tenant_size[key.tenant] > self._tenant_bytes:
            oldest = next(iter(own))
            if oldest == key:
                break  # the session itself is within its own bound
            dropped_other += self._sessions[oldest].size
            self._forget(oldest)
        while self._size > self._total_bytes:
            oldest = next(iter(self._order))
            if oldest == key:
                break
            self._forget(oldest)  # another tenant's, perhaps: this process's bound
        return Dropped(dropped_own, dropped_other)

    async def load_archive(self, key: SessionKey) -> list[Original]:
        session = self._live(key, self._clock())
        return [] if session is None else [o for _, o in session.originals]

    def touch(self, key: SessionKey) -> None:
        """Its snapshot was used: the archive lives as long."""
        session = self._sessions.get(key)
        if session is not None:
            session.expires = self._clock() + self._ttl

    def forget(self, key: SessionKey) -> bool:
        """Remove ``key``'s archive; whether there was one."""
        if key not in self._sessions:
            return False
        self._forget(key)
        return True

    def clear(self) -> None:
        self._sessions.clear()
        self._tenants.clear()
        self._tenant_size.clear()
        self._order.clear()
        self._size = 0

    def _live(self, key: SessionKey, now: float) -> _Session | None:
        session = self._sessions.get(key)
        if session is not None and session.expires < now:
            self._forget(key)
            return None
        return session

    def _forget(self, key: SessionKey) -> None:
        session = self._sessions.pop(key)
        del self._order[key]
        self._size -= session.size
        own = self._tenants[key.tenant]
        del own[key]
        self._tenant_size[key.tenant] -= session.size
        if not own:
            del self._tenants[key.tenant]
            del self._tenant_size[key.tenant]
