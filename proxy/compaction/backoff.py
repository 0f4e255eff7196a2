"""Per-session back-off for summaries that keep failing.

A summarizer that fails or is always cut off (``finish_reason: length``) costs
calls on every turn past the trigger, and each of those turns is trimmed anyway.
After a failed summary the session's summaries are not asked for again for
``compaction.summary_backoff_s``, doubling with each failure in a row up to
``summary_backoff_max_s``, and at least ``COST_FACTOR`` times what the failed attempt
took: on a slow server a summary that held the only slot for minutes (and timed out)
would otherwise come back every few turns, and those turns would queue behind it;
meanwhile its turns are trimmed without a call (counted
as compactions with outcome ``backoff``). A summary that succeeds ends the back-off.
Per process: with several replicas each backs off on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache

from proxy.core.session import TRACKED_LIMIT, SessionKey

# A failed attempt's time is followed by at least this many times as long without one:
# the summarizer's slot stays free for turns at least four fifths of the time.
COST_FACTOR = 4.0


@dataclass(slots=True)
class SummaryBackoff:
    first_s: float  # 0: off
    max_s: float
    clock: Callable[[], float] = time.monotonic
    # Per session: until when not to ask, and the failures in a row so far. Kept past
    # the deadline (so the next failure waits longer); bounded, as clients choose ids.
    entries: LRUCache[SessionKey, tuple[float, int]] = field(
        default_factory=lambda: LRUCache(TRACKED_LIMIT)
    )

    def active(self, key: SessionKey) -> bool:
        """Whether ``key``'s summaries are not to be asked for now."""
        entry = self.entries.get(key)
        return entry is not None and entry[0] > self.clock()

    def failed(self, key: SessionKey, cost_s: float = 0.0) -> None:
        """``key``'s summary failed after ``cost_s`` seconds (bounded by the summary's
        timeout): back off by the clock, or by ``COST_FACTOR`` times that, the longer."""
        if self.first_s <= 0:
            return
        failures = self.entries[key][1] + 1 if key in self.entries else 1
        delay = min(self.first_s * 2 ** min(failures - 1, 30), self.max_s)
        delay = max(delay, COST_FACTOR * cost_s)
        self.entries[key] = (self.clock() + delay, failures)

    def succeeded(self, key: SessionKey) -> None:
        self.entries.pop(key, None)
