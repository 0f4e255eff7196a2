"""What one replica remembers of each session between its requests: one bounded table.

Per replica, bounded, said once here: the small facts the proxy keeps of a session in
memory (rate limits of asked-for compactions, summary back-offs, the cut or snapshot it
served last, when it last noted the session in the store, a lock it waited out) are one
``SessionRecord`` each, in one least-recently-used table of at most ``TRACKED_LIMIT``
sessions. Clients choose session ids, so the table is what bounds them; a record that
carries text (a held summary, a trimmed cut's recap) weighs its characters besides,
so a table of long summaries holds fewer sessions rather than more bytes. With several
replicas each keeps its own: what one forgets, or another never saw, costs a prompt
cache miss or a summary attempt sooner than its back-off would allow, never content
(the snapshots and the archive are in the store).

The owners of each field read and write it (schedule.py, backoff.py, precompact.py,
held.py, sticky.py, sightings.py, compact.py); this module knows none of their rules.
Event loop only: no lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import LRUCache

from proxy.core.session import TRACKED_LIMIT, SessionKey
from proxy.core.snapshot import Snapshot
from proxy.core.trim import Cut

# A record weighs this plus the characters of the text it carries; the table holds
# TRACKED_LIMIT records of no text, ~10 MB, and fewer as their summaries and recaps grow.
RECORD_WEIGHT = 1024
_NEVER = float("-inf")


@dataclass(frozen=True, slots=True)
class Streak:
    """A run of failures in a row, and until when (the owner's clock) not to try again."""

    until: float
    failures: int


@dataclass(frozen=True, slots=True)
class Served:
    """The snapshot a session was served last (held.py); None: the history as sent."""

    snapshot: Snapshot | None


@dataclass(slots=True)
class SessionRecord:
    """One session's facts on this replica; times are the owner's monotonic clock."""

    forced_at: float = _NEVER  # X-Compaction: force last took effect (schedule.py)
    scheduled_at: float = _NEVER  # POST /sessions/{id}/compact last scheduled one
    hinted: bool = False  # scheduled here: its next request skips the far-below path
    failed: Streak | None = None  # summaries that failed in a row (backoff.py)
    idle: Streak | None = None  # plans that saved nothing in a row (compact.settle)
    precompact_until: float = _NEVER  # a background run failed or found nothing to do
    stalled_until: float = _NEVER  # a wait on its summary lock ran out (compact.py)
    sighted_until: float = _NEVER  # noted in the store lately (sightings.py)
    served: Served | None = None  # cache_aware's snapshot served last (held.py)
    cut: Cut | None = None  # the trimmed cut served last (sticky.py)

    @property
    def weight(self) -> int:
        served = self.served.snapshot if self.served is not None else None
        text = (len(served.summary) if served else 0) + (len(self.cut.recap) if self.cut else 0)
        return RECORD_WEIGHT + text


class SessionMemory:
    """The table of ``SessionRecord``s, least recently used first out."""

    __slots__ = ("_table",)

    def __init__(self, limit: int = TRACKED_LIMIT) -> None:
        self._table: LRUCache[SessionKey, SessionRecord] = LRUCache(
            limit * RECORD_WEIGHT, getsizeof=lambda record: record.weight
        )

    def get(self, key: SessionKey) -> SessionRecord | None:
        """``key``'s record, if this replica keeps one; a read never adds one. O(1)."""
        return self._table.get(key)

    def of(self, key: SessionKey) -> SessionRecord:
        """``key``'s record, added (and the least recently used let go) if new."""
        record = self._table.get(key)
        if record is None:
            record = self._table[key] = SessionRecord()
        return record

    def weighed(self, key: SessionKey, record: SessionRecord) -> None:
        """``record`` carries other text now (``served``, ``cut``): weigh it again."""
        self._table[key] = record

    def __len__(self) -> int:
        return len(self._table)
