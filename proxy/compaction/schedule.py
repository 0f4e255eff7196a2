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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from proxy.compaction.memory import SessionMemory
from proxy.core.session import SessionKey, session_from_header, slot_base
from proxy.core.snapshot import Snapshot
from proxy.store import Snapshots

_SCHEDULE_TTL_S = 3600.0


@dataclass(slots=True)
class Schedule:
    """Per-process bookkeeping of asked-for compactions; one per app."""

    force_interval_s: float
    # When each session was last forced and scheduled (the rate limits), and the header
    # sessions this replica scheduled, whose next request skips the far-below fast path
    # (only a hint: the schedule itself lives in the snapshot).
    memory: SessionMemory = field(default_factory=SessionMemory)
    clock: Callable[[], float] = time.monotonic  # for the rate limit; tests pass a fake one
    # Hints set and not taken (evicted ones included): none, and take_hint looks nothing up.
    hints: int = 0

    def may_force(self, key: SessionKey) -> bool:
        """Whether ``X-Compaction: force`` takes effect for ``key`` now (and note it if so)."""
        record = self.memory.get(key)
        if record is not None and self._wait_s(record.forced_at) > 0:
            return False
        self.memory.of(key).forced_at = self.clock()
        return True

    def schedule_wait_s(self, key: SessionKey) -> float:
        """Seconds until POST /sessions/{id}/compact may schedule ``key`` again (0: now)."""
        record = self.memory.get(key)
        return 0.0 if record is None else self._wait_s(record.scheduled_at)

    def _wait_s(self, last: float) -> float:
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
        record = self.memory.of(base)
        record.scheduled_at = self.clock()
        if not record.hinted:
            record.hinted = True
            self.hints += 1
        return True

    def take_hint(self, tenant: str, session_header: str | None) -> bool:
        """Whether this replica scheduled the header session's compaction (once)."""
        if not self.hints or not session_header:
            return False
        record = self.memory.get(session_from_header(tenant, session_header))
        if record is None or not record.hinted:
            return False
        record.hinted = False
        self.hints -= 1
        return True


def scheduled(snapshot: Snapshot | None) -> bool:
    """Whether POST /sessions/{id}/compact asked this session to compact (recently)."""
    if snapshot is None or not snapshot.compact_requested_at:
        return False
    return time.time() - snapshot.compact_requested_at < _SCHEDULE_TTL_S
