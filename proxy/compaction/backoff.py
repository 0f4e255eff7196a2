"""Per-session back-off for summaries that keep failing.

A summarizer that fails or is always cut off (``finish_reason: length``) costs
calls on every turn past the trigger, and each of those turns is trimmed anyway.
After a failed summary the session's summaries are not asked for again for
``compaction.backoff.first_s``, doubling with each failure in a row up to
``backoff.max_s``, and at least ``COST_FACTOR`` times what the failed attempt
took: on a slow server a summary that held the only slot for minutes (and timed out)
would otherwise come back every few turns, and those turns would queue behind it;
meanwhile its turns are trimmed without a call (counted
as compactions with outcome ``backoff``). A summary that succeeds ends the back-off.
Per replica, in its session memory (memory.py): with several replicas each backs off on
its own. The same rule backs off plans that keep saving nothing (compact.settle), as a
second streak of the session's record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from proxy.compaction.memory import SessionMemory, SessionRecord, Streak
from proxy.core.session import SessionKey

# A failed attempt's time is followed by at least this many times as long without one:
# the summarizer's slot stays free for turns at least four fifths of the time.
COST_FACTOR = 4.0


@dataclass(slots=True)
class SummaryBackoff:
    first_s: float  # 0: off
    max_s: float
    clock: Callable[[], float] = time.monotonic
    # Per session: until when not to ask, and the failures in a row so far (a Streak of
    # the record's field ``streak``). Kept past the deadline, so the next failure waits longer.
    memory: SessionMemory = field(default_factory=SessionMemory)
    streak: Literal["failed", "idle"] = "failed"

    def _of(self, record: SessionRecord | None) -> Streak | None:
        if record is None:
            return None
        return record.failed if self.streak == "failed" else record.idle

    def active(self, key: SessionKey) -> bool:
        """Whether ``key``'s summaries are not to be asked for now."""
        streak = self._of(self.memory.get(key))
        return streak is not None and streak.until > self.clock()

    def failed(self, key: SessionKey, cost_s: float = 0.0) -> None:
        """``key``'s summary failed after ``cost_s`` seconds (bounded by the summary's
        timeout): back off by the clock, or by ``COST_FACTOR`` times that, the longer."""
        if self.first_s <= 0:
            return
        record = self.memory.of(key)
        last = self._of(record)
        failures = last.failures + 1 if last is not None else 1
        delay = min(self.first_s * 2 ** min(failures - 1, 30), self.max_s)
        delay = max(delay, COST_FACTOR * cost_s)
        self._set(record, Streak(self.clock() + delay, failures))

    def succeeded(self, key: SessionKey) -> None:
        record = self.memory.get(key)
        if record is not None:
            self._set(record, None)

    def _set(self, record: SessionRecord, streak: Streak | None) -> None:
        if self.streak == "failed":
            record.failed = streak
        else:
            record.idle = streak
