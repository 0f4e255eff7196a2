"""A tenant policy's caps on summaries (tenants.py): ``summaries_per_hour`` (per UTC clock
hour) and ``summarizer_tokens_per_day`` (input + output, per UTC day).

``admit`` runs just before a summary is asked for, under the session's lock: it reads the
tenant's tokens for the day and counts the summary in its hour, and names the cap it is
over, if any; the caller then trims instead (a turn: ``trimmed_at_trigger``, with
``X-Compaction-Degraded`` naming the cap) or skips (a background run). ``spend`` adds
what the summary's calls cost once they are done, failed ones included. Counted in the
store's ``Quota`` (Redis: shared by every replica and worker; ``memory://``: this
process's). A store that fails is counted (``tenant_cap_errors_total``) and the summary
goes ahead: a cap never fails a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypeVar

from proxy.errors import ContextTooLarge, StoreError, SummaryError
from proxy.observe.record import current_record, recording

if TYPE_CHECKING:  # annotations only: compact.py imports this module
    from proxy.compaction.job import Job
    from proxy.compaction.sticky import TrimCuts
    from proxy.core.outcome import Outcome, Turn
    from proxy.core.snapshot import Loaded
    from proxy.observe.metrics.tenants import TenantSeries
    from proxy.store.quota import Quota

log = logging.getLogger("proxy.compaction")

CapReason = Literal["summaries_per_hour", "summarizer_tokens_per_day"]
HOUR, DAY = 3600, 86400
T = TypeVar("T")


class TenantCapped(SummaryError):
    """A background summary its tenant's cap says no to (precompact.py skips it)."""

    code = "tenant_capped"


@dataclass(frozen=True, slots=True)
class TenantCaps:
    quota: Quota
    series: TenantSeries
    clock: Callable[[], float] = time.time  # wall clock: hours and days are UTC ones

    async def admit(self, turn: Turn, background: bool = False) -> CapReason | None:
        """The cap ``turn``'s tenant is over, or None (its summary counted in the hour);
        ``TenantCapped`` instead for a ``background`` run."""
        over = await self._over(turn)
        if over is not None:
            self.series.capped.labels(reason=over).inc()
            if background:
                raise TenantCapped(f"over the tenant's {over}")
        return over

    async def spending(self, turn: Turn, fold: Awaitable[T]) -> T:
        """``fold``'s result, the summarizer tokens it spent added to the tenant's day
        (failed calls too: the request's record counts them, a background run's after
        the request's line was written too)."""
        record = current_record()
        before = record.summarizer_spent
        try:
            with recording(record):  # outside any request's (a script's): one of its own
                return await fold
        finally:
            await self.spend(turn, record.summarizer_spent - before)

    async def _over(self, turn: Turn) -> CapReason | None:
        policy = turn.policy
        if policy is None or not policy.capped:
            return None
        now = self.clock()
        try:
            daily = policy.summarizer_tokens_per_day
            if daily is not None and await self.quota.add(_day(turn, now), 0, DAY) >= daily:
                return "summarizer_tokens_per_day"
            hourly = policy.summaries_per_hour
            if hourly is not None and await self.quota.add(_hour(turn, now), 1, HOUR) > hourly:
                return "summaries_per_hour"
        except StoreError as exc:
            self._failed(exc)
        return None

    async def spend(self, turn: Turn, tokens: int) -> None:
        """Add a summary's ``tokens`` (input + output) to its tenant's day."""
        policy = turn.policy
        if policy is None or policy.summarizer_tokens_per_day is None or tokens <= 0:
            return
        try:
            await self.quota.add(_day(turn, self.clock()), tokens, DAY)
        except StoreError as exc:
            self._failed(exc)

    def _failed(self, exc: StoreError) -> None:
        self.series.cap_errors.inc()
        log.warning("tenant cap not counted (%s): the summary goes ahead", exc.message)


def trimmed_at_trigger(trims: TrimCuts, job: Job, loaded: Loaded) -> Outcome:
    """``job``'s view, over a cap, compacted without a summarizer: trimmed to fit the
    trigger (down to the target, the cut kept while it fits: sticky.py), as a summary
    would have; trimmed to fit the window when the newest message alone is past the
    trigger."""
    budget = job.budget
    early = replace(budget, window=budget.trigger)
    try:
        outcome = trims.outcome(job.key, job.history, loaded, early, reuse=True)
    except ContextTooLarge:
        return trims.for_job(job, loaded)
    return replace(outcome, window=budget.window)


def _hour(turn: Turn, now: float) -> str:
    return f"cap:{turn.tenant}:h:{int(now // HOUR)}"


def _day(turn: Turn, now: float) -> str:
    return f"cap:{turn.tenant}:d:{int(now // DAY)}"
