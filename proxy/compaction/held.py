"""Held cuts: with ``compaction.cache_aware``, the view served last outlives a newer snapshot.

The rule is core/cache_cuts.py's: while the upstream reports cached tokens for the
session (the ledger's totals, observe/ledger.py) and the snapshot this process served
last still applies to the history and fits under the trigger, a snapshot saved since
(a background pre-compaction's) waits, and the upstream keeps seeing the prefix it
caches. Per process, bounded, like sticky.py's trimmed cuts: with several replicas each
holds its own, which costs a cache miss, nothing more. A compaction something asked for
(forced, scheduled, an overflow's recovery) is never held back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cachetools import LRUCache

from proxy.core.budget import Budget
from proxy.core.cache_cuts import holds
from proxy.core.history import History
from proxy.core.session import TRACKED_LIMIT, SessionKey
from proxy.core.snapshot import Loaded, Snapshot, valid_snapshot
from proxy.core.view import view_tokens
from proxy.observe.record import current_record

# An entry weighs this plus its summary's characters (a summary's allowance at most).
_ENTRY_WEIGHT = 1024


def upstream_caches() -> bool:
    """Whether the upstream has reported cached tokens for the current request's session."""
    rec = current_record()
    return rec.ledger is not None and rec.ledger.caches(rec)


@dataclass(frozen=True, slots=True)
class _Served:
    snapshot: Snapshot | None  # None: the history as the client sent it

    @property
    def weight(self) -> int:
        return _ENTRY_WEIGHT + (len(self.snapshot.summary) if self.snapshot else 0)


@dataclass(slots=True)
class HeldCuts:
    """The snapshot each session was served last (keys include the tenant)."""

    entries: LRUCache[SessionKey, _Served] = field(
        default_factory=lambda: LRUCache(
            TRACKED_LIMIT * _ENTRY_WEIGHT, getsizeof=lambda served: served.weight
        )
    )

    def choose(
        self, key: SessionKey, history: History, loaded: Loaded, budget: Budget, asked: bool = False
    ) -> Loaded:
        """The snapshot to plan ``history`` with: the one served last (or none: the
        history as sent) while it holds (cache_cuts.holds) and the upstream caches, else
        ``loaded``; remembered as served. ``asked`` (a compaction something asked for):
        ``loaded``, and nothing held, so the next turn is not served what came before it."""
        if asked:
            self.entries.pop(key, None)
            return loaded
        served = self.entries.get(key)
        last = None if served is None else served.snapshot
        if served is not None and (last.version if last else 0) < loaded.version:
            again = Loaded(last, valid_snapshot(last, history))
            applies = last is None or again.valid is not None
            tokens = view_tokens(history, again.view(history.pinned), budget) if applies else None
            if holds(tokens, budget) and upstream_caches():
                return again
        self.entries[key] = _Served(loaded.valid)
        return loaded
