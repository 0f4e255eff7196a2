"""Sticky trim cuts: a session served trimmed keeps its cut while the cut fits.

A trimmed view recomputed every turn drops down to the target again, so its cut
moves forward a group almost every turn and the upstream sees a new prefix each
time: a provider's prefix cache (llama.cpp's prompt cache, hosted prompt caching)
misses and the whole view is processed again (seconds a turn on a CPU: the figure in
bench/README.md, from bench/realmodel). So the cut served last (trim.Cut: its view and
its recap's text) is kept per session and handed back to the pure trim, which
reuses it while the history still starts with what it dropped and the view fits
the window; past that it trims to the target again, and that cut holds for the
next turns (hysteresis). Kept in the replica's session memory (memory.py): with several
replicas each keeps its own, which costs a cache miss, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from proxy.compaction.memory import SessionMemory
from proxy.core.budget import Budget
from proxy.core.history import History
from proxy.core.outcome import Outcome
from proxy.core.session import SessionKey
from proxy.core.snapshot import Loaded
from proxy.core.trim import trimmed
from proxy.core.wording import SummaryRole


class Trimming(Protocol):
    """What a compaction job (job.Job) tells a trim."""

    @property
    def key(self) -> SessionKey: ...
    @property
    def history(self) -> History: ...
    @property
    def budget(self) -> Budget: ...
    @property
    def trigger(self) -> str: ...


@dataclass(slots=True)
class TrimCuts:
    """The last trimmed cut of each session (keys include the tenant)."""

    summary_role: SummaryRole
    memory: SessionMemory = field(default_factory=SessionMemory)  # a record's ``cut``

    def outcome(
        self, key: SessionKey, history: History, loaded: Loaded, budget: Budget, *, reuse: bool
    ) -> Outcome:
        """``history`` trimmed (trim.trim_outcome), reusing ``key``'s last cut when
        ``reuse`` and it still applies; ``reuse`` False after the upstream refused a
        view as too long, which a view as long again would not cure."""
        record = self.memory.get(key)
        previous = record.cut if reuse and record is not None else None
        outcome, cut = trimmed(history, loaded, budget, self.summary_role, previous)
        if cut is not None or (record is not None and record.cut is not None):
            record = record or self.memory.of(key)
            record.cut = cut
            self.memory.weighed(key, record)
        return outcome

    def for_job(self, job: Trimming, loaded: Loaded) -> Outcome:
        """``outcome`` for a compaction job: a recovery from an overflow trims afresh."""
        reuse = job.trigger != "overflow_recovery"
        return self.outcome(job.key, job.history, loaded, job.budget, reuse=reuse)
