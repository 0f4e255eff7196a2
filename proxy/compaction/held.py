"""Held cuts: with ``compaction.cache_aware``, the view served last outlives a newer snapshot.

The rule is core/cache_cuts.py's: while the upstream reports cached tokens for the
session (the ledger's totals, observe/ledger.py) and the snapshot this process served
last still applies to the history and fits under the trigger, a snapshot saved since
(a background pre-compaction's) waits, and the upstream keeps seeing the prefix it
caches; unless that cache is gone: when the session's last request was sent longer ago
than its provider keeps a prompt (pricing's ``cache_ttl_s``, as the ledger judges
``ttl_expiry``), the waiting snapshot is applied on this turn, whose prefix is paid in
full either way. What was chosen and why is the record's ``cache_plan`` (the line's
field, the ``X-Compaction-Cache-Plan`` header, a series). Kept in the replica's session
memory (memory.py), as sticky.py's trimmed cuts: with several replicas each holds its
own, which costs a cache miss, nothing more. A compaction something asked for (forced,
scheduled, an overflow's recovery) is never held back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

from proxy.compaction.memory import Served, SessionMemory
from proxy.core.budget import Budget
from proxy.core.cache_cuts import cache_plan
from proxy.core.history import History
from proxy.core.session import SessionKey
from proxy.core.snapshot import Loaded, loaded_for
from proxy.core.view import view_tokens
from proxy.observe.record import current_record


def upstream_caches() -> bool:
    """Whether the upstream has reported cached tokens for the current request's session."""
    rec = current_record()
    return rec.ledger is not None and rec.ledger.caches(rec)


def cache_warm() -> bool:
    """Whether the prompt the current request's session sent last is in the provider's
    cache still, by the ledger's clock (its send time and TTL); True when unknown."""
    rec = current_record()
    return rec.ledger is None or rec.ledger.warm(rec, perf_counter())


@dataclass(slots=True)
class HeldCuts:
    """The snapshot each session was served last (keys include the tenant)."""

    memory: SessionMemory = field(default_factory=SessionMemory)  # a record's ``served``

    def choose(
        self, key: SessionKey, history: History, loaded: Loaded, budget: Budget, asked: bool = False
    ) -> Loaded:
        """The snapshot to plan ``history`` with: the one served last (or none: the
        history as sent) while it holds under the trigger, the upstream caches and the
        session's cache is warm (cache_cuts.cache_plan: the plan noted on the record),
        else ``loaded``; remembered as served. ``asked`` (a compaction something asked
        for): ``loaded``, and nothing held, so the next turn is not served what came
        before it."""
        rec = current_record()
        rec.cache_plan = None  # a recovery's second look plans afresh
        record = self.memory.get(key)
        if asked:
            if record is not None and record.served is not None:
                record.served = None
                self.memory.weighed(key, record)
            return loaded
        served = None if record is None else record.served
        last = None if served is None else served.snapshot
        if served is not None and (last.version if last else 0) < loaded.version:
            again = loaded_for(last, history)
            applies = last is None or again.valid is not None
            tokens = view_tokens(history, again.view(history.pinned), budget) if applies else None
            plan = cache_plan(tokens, budget, caches=upstream_caches(), warm=cache_warm())
            rec.cache_plan = plan
            if plan == "held":
                return again
        record = record or self.memory.of(key)
        record.served = Served(loaded.valid)
        self.memory.weighed(key, record)
        return loaded
