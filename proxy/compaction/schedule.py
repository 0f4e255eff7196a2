"""Compactions asked for outside the trigger, and how often they may be.

``X-Compaction: force`` compacts a session now, at most once per
``compaction.force_interval_s``; ``POST /sessions/{id}/compact`` is limited alike
(a 429 with ``Retry-After`` within it), since each buys a summary. It writes the ask
into the session's snapshot, so whichever replica serves the next request
compacts; the replica that took the ask also remembers it as a hint, because
its next request must skip the far-below fast path, which never reads the store.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cachetools import LRUCache

from proxy.core.session import TRACKED_LIMIT, SessionKey, session_from_header, slot_base
from proxy.core.snapshot import Snapshot
from proxy.store import Snapshots

_SCHEDULE_TTL_S = 3600.0


@dataclass(slots=True)
class Schedule:
    """Per-process bookkeeping of asked-for compactions; one per app."""

    force_interval_s: float
    # X-Compaction: force, per session: when it last took effect (rate limit).
    # Bounded: when every entry is recent, the least recently forced goes first.
    last_forced: LRUCache[SessionKey, float] = field(
        default_factory=lambda: LRUCache(TRACKED_LIMIT)
    )
    # POST /sessions/{id}/compact, per session: when it last scheduled one (rate limit).
    last_scheduled: LRUCache[SessionKey, float] = field(
        default_factory=lambda: LRUCache(TRACKED_LIMIT)
    )
    # Header sessions this replica scheduled: their next request skips the far-below
    # fast path. Only a hint, bounded; the schedule itself lives in the snapshot.
    hints: OrderedDict[SessionKey, None] = field(default_factory=OrderedDict)
    clock: Callable[[], float] = time.monotonic  # for the rate limit; tests pass a fake one

    def may_force(self, key: SessionKey) -> bool:
        """Whether ``X-Compaction: force`` takes effect for ``key`` now (and note it if so)."""
        if self._wait_s(self.last_forced, key) > 0:
            return False
        self.last_forced[key] = self.clock()  # clients choose session ids: bounded
        return True

    def schedule_wait_s(self, key: SessionKey) -> float:
        """Seconds until POST /sessions/{id}/compact may schedule ``key`` again (0: now)."""
        return self._wait_s(self.last_scheduled, key)

    def _wait_s(self, last_times: LRUCache[SessionKey, float], key: SessionKey) -> float:
        last = last_times.get(key)
        if last is None:
            return 0.0
        return max(0.0, self.force_interval_s - (self.clock() - last))

    async def request(self, store: Snapshots, key: SessionKey) -> bool:
        """Make the session's next request compact (POST /sessions/{id}/compact): the
        request is written into the session's snapshot, so every replica sees it and it
        costs nothing beyond the session itself. False when there is no such session."""
        for _ in range(3):  # a concurrent compaction may win the compare-and-swap
            snapshot = await store.load(key)
            if snapshot is None:
                return False
            scheduled = replace(
                snapshot, version=snapshot.version + 1, compact_requested_at=time.time()
            )
            if await store.save(key, scheduled):
                break
        base = slot_base(key)  # the session, whichever of its slots was scheduled
        self.last_scheduled[base] = self.clock()
        self.hints[base] = None
        if len(self.hints) > TRACKED_LIMIT:
            self.hints.popitem(last=False)
        return True

    def take_hint(self, tenant: str, session_header: str | None) -> bool:
        """Whether this replica scheduled the header session's compaction (once)."""
        if not self.hints or not session_header:
            return False
        key = session_from_header(tenant, session_header)
        return self.hints.pop(key, False) is None


def scheduled(snapshot: Snapshot | None) -> bool:
    """Whether POST /sessions/{id}/compact asked this session to compact (recently)."""
    if snapshot is None or not snapshot.compact_requested_at:
        return False
    return time.time() - snapshot.compact_requested_at < _SCHEDULE_TTL_S
