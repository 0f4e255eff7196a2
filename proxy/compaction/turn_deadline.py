"""A turn's own deadline: an inline summary delays its turn at most
``compaction.summary_deadline_s``.

The compaction a plan asks for (compact.py) runs as a task the turn waits for until its
deadline. Past it the turn is served without its summary, from the last snapshot when that
still fits the window, else the trimmed view (recall by excerpts then searches what the
trim drops: recall.py), and says so (``X-Compaction-Degraded: summary_deadline``, counted
by reason). The summary finishes in the background (the precompactor adopts it: bounded by
``summary_timeout_s`` and its slots, counted as a background run) when the model allows
it; a model declared ``precompact: false`` or known to have one slot (``slots: 1``: its
next turn would queue behind the summary) has it dropped, cancelled upstream (counted as
the compaction outcome ``dropped``), and the session backs off by what it cost
(backoff.py).

Every summary's time is learned per tenant and model (pace.py): once a model's summaries
are known to take longer than the deadline, none is asked for inline (counted as the
outcome ``too_slow``, served as past the deadline, ``summary_slow``); where background
summaries are allowed it starts there at once instead. While any of these summaries runs,
the model is busy (busy.py): turns sent to it meanwhile say ``summary_busy``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from proxy.compaction.fold import SUMMARY_WATCH, SummaryWatch
from proxy.compaction.job import Job
from proxy.compaction.pace import SummaryPace
from proxy.core.budget import MIN_SUMMARY_TOKENS
from proxy.core.outcome import Degraded, Outcome
from proxy.core.plan import Plan
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.core.snapshot import Loaded
from proxy.core.view import fits
from proxy.observe.record import current_record

if TYPE_CHECKING:  # annotations only: services.py builds both first, and passes them
    from proxy.compaction.compact import Compactor
    from proxy.compaction.precompact import Precompactor

log = logging.getLogger("proxy.compaction")


@dataclass(slots=True)
class TurnDeadline:
    """Inline compactions bounded by their turn's deadline; one per app."""

    compactor: Compactor
    precompactor: Precompactor
    pace: SummaryPace
    clock: Callable[[], float] = time.monotonic

    async def compact(self, job: Job, loaded: Loaded, plan: Plan) -> Outcome:
        """``Compactor.compact``, the turn served without it past its deadline."""
        c = job.turn.compaction(self.compactor.settings.compaction)
        deadline, (start, end) = c.summary_deadline_s, plan.summarize
        if not deadline or start == end:  # no bound, or nothing to summarize (elision)
            return await self.compactor.compact(job, loaded, plan)
        model = self._summarizer(job)
        expected = self.pace.expected_s(job.key.tenant, model)
        if expected is not None and expected > deadline and not self._sized(job, model):
            # It would not finish in time: to the background at once, where allowed.
            if (
                job.turn.model.keeps_late_summaries
                and self.precompactor.skip_reason(job.key) is None
            ):
                task = asyncio.create_task(self._timed(job, loaded, plan, SummaryWatch()))
                if not self.precompactor.adopt(job.key, task):  # it says yes: just asked
                    task.cancel()
            return self._too_slow(job, loaded, model, (expected, deadline))
        started, watch = self.clock(), SummaryWatch()
        task = asyncio.create_task(self._timed(job, loaded, plan, watch))
        try:
            done, _ = await asyncio.wait({task}, timeout=deadline)
        except asyncio.CancelledError:
            task.cancel()  # the turn's caller is gone: so is its summary
            raise
        if done:
            return task.result()
        return await self._past(job, loaded, task, watch, started)

    def _sized(self, job: Job, model: str) -> bool:
        """Whether a summary sized to finish by the deadline (fold.py sizes it) is still
        worth asking for inline: on a model whose summaries past it are dropped."""
        if job.turn.model.keeps_late_summaries:  # past it, the background finishes a full one
            return False
        deadline = job.turn.compaction(self.compactor.settings.compaction).summary_deadline_s
        cap = self.pace.affordable(job.key.tenant, model, deadline)
        return cap is not None and cap >= MIN_SUMMARY_TOKENS

    def _summarizer(self, job: Job) -> str:
        return self.compactor.folder.summarizer(job.turn).name

    async def _timed(self, job: Job, loaded: Loaded, plan: Plan, watch: SummaryWatch) -> Outcome:
        """The compaction (in a task of its own), the summarizer's model busy meanwhile.
        ``watch``: whether it asked for a summary, and what it allowed (fold.py)."""
        SUMMARY_WATCH.set(watch)  # this task's context only
        busy, summarizer = self.precompactor.busy, self.compactor.folder.summarizer(job.turn)
        if summarizer.single_slot:
            busy.give_way(summarizer.name)  # a background summary there would hold this one up
        with busy.summarizing(summarizer.name) as lease:
            watch.ended = lease.end  # off the model once its calls are over
            return await self.compactor.compact(job, loaded, plan)  # fold.py learns its pace

    async def _past(
        self,
        job: Job,
        loaded: Loaded,
        task: asyncio.Task[Outcome],
        watch: SummaryWatch,
        started: float,
    ) -> Outcome:
        """The turn served without ``task``'s summary, which goes on in the background or
        is dropped; ``watch`` says whether it asked for one, since ``started``."""
        key = job.key
        summarizing = watch.started  # its own, not a wait for another request's
        degraded: Degraded = "summary_deadline" if summarizing else "summary_late"
        if job.turn.model.keeps_late_summaries and self.precompactor.adopt(key, task):
            kept = "finishing in the background"
        else:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its lock released
            kept = "dropped"
            if summarizing:
                cost = self.clock() - started
                current_record().summary_s = cost  # the request's line: what it waited
                self.compactor.backoff.failed(key, cost)
                model = self._summarizer(job)
                self.pace.ran_out(key.tenant, model, cost, watch.max_tokens or None)
                metrics = self.compactor.metrics
                metrics.compactions.labels(trigger=job.trigger, outcome="dropped").inc()
        log.warning(
            "session=%s summary past the turn's %.1f s deadline (%s); served without it",
            key.log_id,
            self.clock() - started,
            kept,
        )
        return replace(served_without(self.compactor, job, loaded), degraded=degraded)

    def _too_slow(
        self, job: Job, loaded: Loaded, model: str, times: tuple[float, float]
    ) -> Outcome:
        """Not asked inline: ``model``'s summaries take longer than the deadline
        (``times``: the summary's expected seconds, the deadline's)."""
        (expected, deadline), tenant = times, job.key.tenant
        current_record().trigger = job.trigger
        self.compactor.metrics.compactions.labels(trigger=job.trigger, outcome="too_slow").inc()
        speed = self.pace.speed(tenant, model)
        log.info(
            "compaction",
            extra={
                "fields": {
                    "session": job.key.log_id,
                    "trigger": job.trigger,
                    "outcome": "too_slow",
                    "expected_summary_ms": round(expected * 1000),
                    "deadline_ms": round(deadline * 1000),
                    "summarizer_tokens_per_s": None if speed is None else round(speed, 1),
                }
            },
        )
        return replace(served_without(self.compactor, job, loaded), degraded="summary_slow")


def served_without(compactor: Compactor, job: Job, loaded: Loaded) -> Outcome:
    """``job``'s turn under ``loaded``'s snapshot when it fits the window, else trimmed."""
    h, budget, role = job.history, job.budget, compactor.settings.compaction.summary_role
    view = loaded.view(h.pinned)
    if fits(h, view, budget):
        return rebuild_outcome(h, view, Handoff.of(loaded, role), budget)
    return compactor.trims.for_job(job, loaded)
