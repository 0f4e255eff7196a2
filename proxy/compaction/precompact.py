"""Background pre-compaction: compact a session after its answer is out, before it must.

A turn whose view passes ``compaction.precompact.ratio`` of the window (below the
trigger) leaves a follow-up beside its ``Outcome``; once its answer is out (a stream:
ended), it starts a task that compacts the history that turn sent, under the same lock
and compare-and-swap as an inline compaction (``Compactor.try_compact``). The next
turn's history extends it, so the turn that would have crossed the trigger finds its
view compacted already and does not wait for a summary.

It plans as inline with the window scaled by ``precompact.ratio / trigger_ratio``, down
to ``target_ratio`` scaled alike (0.6 -> 0.375 by default), so each compaction still
folds in a sizeable span: a third more summaries than inline (0.8 -> 0.5), not the three
times as many of compacting to ``target_ratio`` itself, each a change of the cached prefix.

Bounded: at most ``precompact.concurrency`` runs at once in the process (more are
skipped), one per session, and a session whose run failed or found nothing to do
is not tried again for ``precompact.retry_s``. Shared fairly between tenants: a
tenant may fill the free slots while nobody else wants one, but a tenant under its
share (``precompact.per_tenant``, by default half the slots rounded up) that finds
them all taken preempts the newest run of a tenant over its share (counted
``preempted``; that session is not backed off and is offered again by its next
turn), so one tenant's throwaway sessions cannot keep another's from compacting.
A held lock means the session is being compacted already: skipped, never waited for.
On a single-slot server a run gives way to any turn sent to its model (busy.py: counted
``yielded``, backed off as a failure). An inline compaction that outlived its turn's
deadline may be adopted to finish here (``adopt``, turn_deadline.py), within the same
bounds. ``aclose`` cancels and awaits what runs. Every outcome counted; none raises.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

from proxy.compaction.busy import BusyModels
from proxy.compaction.caps import TenantCapped
from proxy.compaction.fold import SUMMARY_WATCH, SummaryWatch
from proxy.compaction.held import upstream_caches
from proxy.compaction.job import Job
from proxy.compaction.snapshots import load_snapshot
from proxy.compaction.warm import count_warmup, warmed
from proxy.config import CompactionSettings
from proxy.core.budget import Budget
from proxy.core.cache_cuts import landing_ratio
from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.core.plan import plan_compaction
from proxy.core.session import SessionKey
from proxy.core.view import fits
from proxy.errors import SummaryError
from proxy.observe.metrics import Metrics
from proxy.upstream.api import Attempt

if TYPE_CHECKING:
    from proxy.compaction.compact import Compactor
    from proxy.compaction.prepare import Prepared

log = logging.getLogger("proxy.compaction")
# Runs after which the session is not offered again for precompact.retry_s.
_BACKED_OFF = ("failed", "unchanged", "skipped_tenant_cap", "yielded")


def background_budget(
    budget: Budget, settings: CompactionSettings, *, held: bool = False
) -> Budget:
    """``budget`` as pre-compaction plans with it: the trigger at ``precompact.ratio``
    of the window and the target scaled by the same factor; ``held`` (cache_aware, the
    upstream caching): its snapshot waits for the trigger (held.py), so the target is
    core/cache_cuts.py's ``landing_ratio``, where the view lands at ``target_ratio`` then."""
    ratio = settings.precompact.ratio or settings.trigger_ratio
    target = settings.target_ratio * ratio / settings.trigger_ratio
    if held:
        target = landing_ratio(settings.trigger_ratio, settings.target_ratio, ratio)
    return replace(budget, trigger=int(budget.window * ratio), target=round(budget.window * target))


def wants_precompaction(tokens: int, window: int, settings: CompactionSettings) -> bool:
    """Whether a view of ``tokens`` (reserve included, as the trigger counts them) is past
    the soft threshold: worth compacting in the background once the answer is out."""
    ratio = settings.precompact.ratio
    return bool(ratio) and tokens > int(window * (ratio or 0))


@dataclass(slots=True)
class Precompactor:
    """Per-process background compactions; one per app, built in the lifespan."""

    settings: CompactionSettings
    compactor: Compactor
    metrics: Metrics
    clock: Callable[[], float] = time.monotonic  # its back-off in compactor.memory: the same
    running: dict[SessionKey, asyncio.Task[str]] = field(default_factory=dict)
    # Runs cancelled to make room for a tenant under its share: counted as such.
    preempted: set[SessionKey] = field(default_factory=set)
    closed: bool = False
    share: int = field(init=False)  # slots one tenant may keep while another wants one
    # The models that runs ask for summaries now: turns sent to them meanwhile may queue.
    busy: BusyModels = field(default_factory=BusyModels)

    def __post_init__(self) -> None:
        slots = self.settings.precompact.concurrency
        self.share = min(self.settings.precompact.per_tenant or math.ceil(slots / 2), slots)

    def offer(self, turn: Turn, p: Prepared, tokens: int) -> FollowUp | None:
        """What to start once ``turn``'s answer is out, when its view (``tokens``) is past
        the soft threshold; None otherwise, or for a side request. O(1) on the request path."""
        c = turn.compaction(self.settings)  # its tenant's policy's
        wanted = turn.model.precompact and wants_precompaction(tokens, p.budget.window, c)
        if p.loaded.side or not wanted:
            return None
        early = background_budget(p.budget, c, held=c.cache_aware and upstream_caches())
        job = Job(turn, p.key, p.history, early, "precompact", background=True)
        return partial(self.start, job)

    def note_sent(self, turn: Turn | None, attempt: Attempt) -> Attempt:
        """``attempt``, to be sent for ``turn``: counted, and its answer marked
        ``summary_busy`` (unless degraded already), when a summary of the proxy's own on
        its model runs meanwhile: a single-slot server makes it wait for that summary
        (busy.py); on a model known to have one slot, a background summary gives way
        (cancelled) instead. O(1)."""
        if turn is None or not self.busy.busy(model := turn.chat["model"]):
            return attempt
        if turn.model.single_slot and not self.busy.give_way(model):
            return attempt  # what ran there was cancelled: the turn waits for no summary
        self.metrics.sent_during_summary.inc()
        if attempt.outcome.degraded is not None:
            return attempt
        return replace(attempt, outcome=replace(attempt.outcome, degraded="summary_busy"))

    async def start(self, job: Job) -> None:
        """Start compacting ``job``'s session in the background, unless a bound says no.
        Returns at once: the response that triggered it never waits on it."""
        key = job.key
        skipped = self.skip_reason(key)
        if skipped == "skipped_cap":
            skipped = await self._preempt_for(key)
        if skipped is not None:
            self.metrics.precompactions.labels(outcome=skipped).inc()
            return
        task = asyncio.create_task(self._run(job))
        self.running[key] = task
        self.metrics.precompactions_running.inc()
        task.add_done_callback(partial(self._done, key))

    def adopt(self, key: SessionKey, compaction: asyncio.Task[Outcome]) -> bool:
        """Let ``compaction``, an inline one that outlived its turn's deadline
        (turn_deadline.py), finish as a background run: bounded, counted and cancelled at
        close as one. False when a bound says no (the caller drops it): closing, a run of
        the session already (which it waits for), every slot taken."""
        if self.closed or key in self.running:
            return False
        if len(self.running) >= self.settings.precompact.concurrency:
            return False
        task = asyncio.create_task(_finished(compaction))
        self.running[key] = task
        self.metrics.precompactions_running.inc()
        task.add_done_callback(partial(self._done, key))
        return True

    def skip_reason(self, key: SessionKey) -> str | None:
        """Why ``key`` is not pre-compacted now (a metric outcome), or None to go ahead."""
        if self.closed:
            return "cancelled"
        if key in self.running:
            return "skipped_running"
        if self.backed_off(key) or self.compactor.backoff.active(key):
            return "skipped_backoff"
        if len(self.running) >= self.settings.precompact.concurrency:
            return "skipped_cap"
        return None

    def backed_off(self, key: SessionKey) -> bool:
        """Whether ``key``'s last run failed or did nothing ``precompact.retry_s`` ago or less."""
        record = self.compactor.memory.get(key)
        return record is not None and record.precompact_until > self.clock()

    async def _preempt_for(self, key: SessionKey) -> str | None:
        """Every slot is taken: free one for ``key``'s tenant if it is under its share
        and another tenant is over its own (that tenant's newest run is cancelled and
        awaited); "skipped_cap" when there is none to take."""
        held: dict[str, list[SessionKey]] = {}
        for running in self.running:  # at most precompact.concurrency entries
            held.setdefault(running.tenant, []).append(running)
        if len(held.get(key.tenant, ())) >= self.share:
            return "skipped_cap"
        over = [keys for keys in held.values() if len(keys) > self.share]
        if not over:
            return "skipped_cap"
        victim = max(over, key=len)[-1]  # the most slots; its newest run (least work lost)
        task = self.running.pop(victim)
        # Not if it finished meanwhile, or gave way already: then it is counted as it ended.
        if task not in self.busy.gave_way and task.cancel():
            self.preempted.add(victim)
        await asyncio.gather(task, return_exceptions=True)  # its lock released on the way out
        return self.skip_reason(key)  # another start may have taken the slot meanwhile

    def _done(self, key: SessionKey, task: asyncio.Task[str]) -> None:
        # Here, not in _run: a task cancelled before it ever ran never enters _run.
        if self.running.get(key) is task:
            del self.running[key]
        self.metrics.precompactions_running.dec()
        outcome = "cancelled" if task.cancelled() else task.result()
        if task in self.busy.gave_way:  # cancelled for a turn (busy.py): offered again later
            self.busy.gave_way.discard(task)
            if task.cancelled():  # else it finished first: counted as it ended
                outcome = "yielded"
                log.info("session=%s background summary gave way to a turn", key.log_id)
        if key in self.preempted:
            self.preempted.discard(key)
            outcome = "preempted"  # not the session's failure: no back-off
        self.metrics.precompactions.labels(outcome=outcome).inc()
        if outcome in _BACKED_OFF and self.settings.precompact.retry_s > 0:
            retry_at = self.clock() + self.settings.precompact.retry_s
            self.compactor.memory.of(key).precompact_until = retry_at

    async def _run(self, job: Job) -> str:
        """The run's outcome; raises nothing but ``CancelledError``."""
        try:
            c = job.turn.compaction(self.settings)
            summarizer = self.compactor.folder.summarizer(job.turn)
            with self.busy.summarizing(summarizer.name, yields=summarizer.single_slot) as lease:
                SUMMARY_WATCH.set(SummaryWatch(ended=lease.end))  # off the model once answered
                if summarizer.single_slot:  # a turn sent meanwhile cancels this at no cost
                    await asyncio.sleep(c.precompact.idle_s)
                outcome = await self._compact(job)
            if isinstance(outcome, str):
                return outcome
            if job.turn.model.single_slot:  # its next turn's view read while none waits
                base_url = self.compactor.settings.upstream.base_url
                warm = await warmed(self.compactor.client, base_url, job.turn, outcome, self.busy)
                count_warmup(self.metrics, warm)
            return "compacted"
        except TenantCapped:
            return "skipped_tenant_cap"  # counted by its cap too (caps.py)
        except SummaryError as exc:  # its message names the failure, never content
            log.warning("session=%s background summary failed (%s)", job.key.log_id, exc)
            return "failed"
        # A background task has no caller to raise to: whatever went wrong is logged
        # (its type only: no content) and counted, and the session compacts inline later.
        except Exception as exc:
            failed = type(exc).__name__
            log.warning("session=%s background compaction failed: %s", job.key.log_id, failed)
            return "failed"

    async def _compact(self, job: Job) -> str | Outcome:
        h = job.history
        # The turn's snapshot may have been replaced since: plan from the current one.
        loaded = await load_snapshot(self.compactor.store, job.key, h)
        view = loaded.view(h.pinned)
        # A compaction since the turn (another task's, often) got there; or a side request
        # offered before its conversation's snapshot landed: that is not its to replace.
        if loaded.side or fits(h, view, job.budget, job.budget.trigger):
            return "covered"
        plan = plan_compaction(h, view, job.budget, settled=loaded.settled)
        if plan.action != "compact":
            return "unchanged"  # nothing worth folding in: back off
        outcome = await self.compactor.try_compact(job, loaded, plan)
        if outcome is None:
            return "skipped_locked"
        if outcome.status != "compacted":
            return "covered"  # another compaction landed between our plan and the lock
        self.metrics.compactions.labels(trigger="precompact", outcome="compacted").inc()
        self.metrics.compactions_by_trigger.labels(trigger="background").inc()
        return outcome  # compacted

    async def aclose(self) -> None:
        """Cancel every running background compaction and wait for them to end (their
        locks are released on the way out); start no more."""
        self.closed = True
        tasks = list(self.running.values())
        self.preempted.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _finished(compaction: asyncio.Task[Outcome]) -> str:
    """An adopted compaction's outcome, as a background run's is counted; cancelling
    this cancels it."""
    try:
        outcome = await compaction
    # Nobody to raise to, as in Precompactor._run: logged (its type only) and counted.
    except Exception as exc:
        log.warning("background end of an inline compaction failed: %s", type(exc).__name__)
        return "failed"
    if outcome.status == "compacted":
        return "compacted"
    return "covered" if outcome.degraded is None else "failed"
