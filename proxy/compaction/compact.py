"""Steps 7-8 for a plan that compacts: summarize under the session's single-flight lock.

One summarization per session at a time, across replicas: the request that takes the
session's lock re-reads the snapshot (another replica may have compacted between its plan
and the lock) and plans again from it, folds the span into the summary (fold.py; asked
after what its view sent: summary_prefix.py), writes the new snapshot (compare-and-swap
on the version) and rebuilds the messages. Concurrent requests wait, bounded, for that
result, or use the last valid snapshot. A failing summarizer never fails the request: the
view is trimmed (trim.py), the summary retried after the session's back-off (backoff.py).
A plan that saves nothing (plan.py) is no compaction: ``settle`` counts it, writes
nothing and backs the session off likewise."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from proxy.compaction.backoff import SummaryBackoff
from proxy.compaction.caps import TenantCaps, trimmed_at_trigger
from proxy.compaction.fold import Folder
from proxy.compaction.job import Job
from proxy.compaction.memory import SessionMemory
from proxy.compaction.pace import SummaryPace
from proxy.compaction.snapshots import archive_span, keep_rewind_point, load_snapshot, next_snapshot
from proxy.compaction.sticky import TrimCuts
from proxy.compaction.summary_prefix import sent_prefix
from proxy.config import Settings
from proxy.core.models import ModelTable
from proxy.core.outcome import Degraded, Outcome, counted_as
from proxy.core.plan import Plan, plan_compaction
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.core.session import slot_count
from proxy.core.snapshot import Loaded, Snapshot
from proxy.core.tokens import TokenCounter
from proxy.core.view import fits, view_tokens
from proxy.errors import SummaryError
from proxy.observe.metrics import Metrics
from proxy.observe.record import current_record
from proxy.store import Archive, LockStore, Snapshots
from proxy.upstream.seam import Upstream

log = logging.getLogger("proxy.compaction")
_POLL_S = 0.05


class CompactionStore(Snapshots, LockStore, Protocol):
    """What compaction needs of a store: snapshots, and the lock around summarizing."""


@dataclass(slots=True)
class Compactor:
    """Per-process single-flight state; one per app, built in the lifespan."""

    settings: Settings
    store: CompactionStore
    counters: dict[str, TokenCounter]
    client: Upstream  # summaries are asked of the upstream through it
    models: ModelTable
    metrics: Metrics
    # Its back-offs, trimmed cuts and locks waited out, per session (memory.py).
    memory: SessionMemory = field(default_factory=SessionMemory)
    # Waiting runs on these: tests pass a fake clock and let time pass without sleeping.
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    caps: TenantCaps | None = None  # tenants' caps on summaries (caps.py); None: none
    archive: Archive | None = None  # of the originals a new snapshot covers (snapshots.py)
    backoff: SummaryBackoff = field(init=False)  # sessions whose summaries keep failing
    idle: SummaryBackoff = field(init=False)  # sessions whose plans keep saving nothing
    trims: TrimCuts = field(init=False)  # sessions' last trimmed cuts, reused (sticky.py)
    folder: Folder = field(init=False)  # asks for summaries, sized by their pace (pace.py)

    def __post_init__(self) -> None:
        c = self.settings.compaction
        args = (self.settings, self.models, self.client, self.counters, self.metrics)
        self.folder = Folder(*args, SummaryPace.of(c))
        spans = (c.backoff.first_s, c.backoff.max_s, self.clock, self.memory)
        self.backoff = SummaryBackoff(*spans, "failed")
        self.idle = SummaryBackoff(*spans, "idle")
        self.trims = TrimCuts(c.summary_role, self.memory)

    def settle(self, job: Job, loaded: Loaded, plan: Plan) -> Plan:
        """``plan``, or the view kept as it is. A plan with nothing to save is counted
        and logged as such (no version, no snapshot written) and backs the session off
        as a failed summary does; meanwhile a summary the threshold asks for waits while
        the view still fits the window (counted ``backoff``), and the next compaction
        that saves tokens ends the back-off."""
        if plan.nothing_to_save:
            if not self.idle.active(job.key):  # doubles per back-off run out, not per turn
                self.idle.failed(job.key)
            self.metrics.compactions.labels(trigger=job.trigger, outcome="nothing_to_save").inc()
            kept = Outcome.unchanged(plan.tokens - job.budget.reserve, job.budget.window)
            kept = replace(kept, version=loaded.version)
            self._log(job, loaded, kept, self.clock(), "nothing_to_save")
            return plan
        start, end = plan.summarize
        if start == end or job.trigger != "threshold" or not self.idle.active(job.key):
            return plan
        h, budget = job.history, job.budget
        current = loaded.view(h.pinned)
        tokens = view_tokens(h, current, budget)
        if tokens > budget.window:
            return plan  # a summary beats a trim
        self.metrics.compactions.labels(trigger=job.trigger, outcome="backoff").inc()
        return Plan("keep", current, (current.covered, current.covered), tokens, True)

    async def compact(self, job: Job, loaded: Loaded, plan: Plan) -> Outcome:
        """Carry out ``plan`` (against ``loaded``), once per session at a time; log it."""
        started = self.clock()
        current_record().trigger = job.trigger
        start, end = plan.summarize
        if start != end and self.backoff.active(job.key):
            # Its last summary failed: trim without asking (nor taking the lock) this time.
            outcome = replace(self.trims.for_job(job, loaded), degraded="backoff")
            self.metrics.compactions.labels(trigger=job.trigger, outcome="backoff").inc()
            self._log(job, loaded, outcome, started)
            return outcome
        outcome = await self._compact(job, loaded, plan)
        self.metrics.compactions.labels(trigger=job.trigger, outcome=counted_as(outcome)).inc()
        if outcome.status == "compacted":
            self.metrics.compactions_by_trigger.labels(trigger="inline").inc()
        self._log(job, loaded, outcome, started)
        return outcome

    async def try_compact(self, job: Job, loaded: Loaded, plan: Plan) -> Outcome | None:
        """``compact`` for a background job, which nobody waits for: None at once when
        another request holds the session's lock. A failed summary raises its
        ``SummaryError`` (nothing to trim for). The caller counts the outcome."""
        started = self.clock()
        start, end = plan.summarize
        if start == end:
            outcome = await self._compact(job, loaded, plan)  # elision only: no lock
        else:
            token = await self.store.acquire(job.key, self._lock_ttl)
            if token is None:
                return None
            outcome = await self._locked(job, loaded, plan, token)
        self._log(job, loaded, outcome, started)
        return outcome

    @property
    def _lock_ttl(self) -> float:
        return self.settings.compaction.summary_timeout_s + 5

    def _log(
        self, job: Job, loaded: Loaded, outcome: Outcome, started: float, status: str = ""
    ) -> None:
        h = job.history
        previous = view_tokens(h, loaded.view(h.pinned), job.budget)
        # Fields: JSON lines carry them as keys, text lines as key=value (proxy/observe/logs.py).
        fields = {
            "session": job.key.log_id,
            "trigger": job.trigger,
            "outcome": status or outcome.status,
            # Input tokens, as the request line counts them: the output reserve is not sent.
            "tokens_before": previous - job.budget.reserve,
            "tokens_after": outcome.tokens,
            "version": outcome.version,
            "restored_identifiers": outcome.restored,
            "duration_ms": round((self.clock() - started) * 1000),
        }
        log.info("compaction", extra={"fields": fields})

    def _shown(self, job: Job, loaded: Loaded, plan: Plan) -> Outcome:
        """``plan.view`` under ``loaded``'s summary, trimmed if it does not fit."""
        if plan.fits:
            handoff = Handoff.of(loaded, self.settings.compaction.summary_role)
            return rebuild_outcome(job.history, plan.view, handoff, job.budget)
        return self.trims.for_job(job, loaded)

    async def _compact(self, job: Job, loaded: Loaded, plan: Plan) -> Outcome:
        start, end = plan.summarize
        if start == end:
            # Elision alone was enough: no model call, no lock needed.
            new = next_snapshot(loaded, loaded.summary, plan, job)
            return await self._saved(job, loaded, new, plan)

        token = await self.store.acquire(job.key, self._lock_ttl)
        if token is None:
            return await self._wait_for_other(job, loaded)
        return await self._locked(job, loaded, plan, token)

    async def _locked(self, job: Job, loaded: Loaded, plan: Plan, token: str) -> Outcome:
        """Summarize under the session's lock (``token``), re-planning first if another
        request compacted since ``loaded``; release the lock."""
        try:
            fresh = await load_snapshot(self.store, job.key, job.history)
            if fresh.version != loaded.version:
                # Another request (maybe on another replica) compacted between our
                # plan and the lock: plan again from its snapshot instead of repeating it.
                h, loaded = job.history, fresh
                view = fresh.view(h.pinned)
                plan = plan_compaction(h, view, job.budget, force=job.force, settled=fresh.settled)
                start, end = plan.summarize
                if start == end:
                    return self._shown(job, loaded, plan)
            return await self._summarize(job, loaded, plan)
        finally:
            await self.store.release(job.key, token)

    async def _summarize(self, job: Job, loaded: Loaded, plan: Plan) -> Outcome:
        """Fold ``plan.summarize`` into the summary and save it; the caller holds the lock."""
        start, end = plan.summarize
        span = job.history.messages[start:end]
        if self.caps is not None and (over := await self.caps.admit(job.turn, job.background)):
            return replace(trimmed_at_trigger(self.trims, job, loaded), degraded=over)
        started = self.clock()
        prefix = sent_prefix(job, loaded, plan.summarize, self.settings.compaction)
        fold = self.folder.fold(job, loaded.summary, span, prefix)
        try:
            folded = await (fold if self.caps is None else self.caps.spending(job.turn, fold))
        except SummaryError as exc:
            self.backoff.failed(job.key, self.clock() - started)
            if job.background:
                raise  # no turn to serve a fallback to: the precompactor counts it
            log.warning(
                "session=%s summarization failed (%s); trimming instead", job.key.log_id, exc
            )
            return self._failed(job, self.trims.for_job(job, loaded), started)
        if folded is None:  # far over its budget: not kept
            self.backoff.failed(job.key, self.clock() - started)
            return self._failed(job, self.trims.for_job(job, loaded), started)
        self.backoff.succeeded(job.key)
        plan = replace(plan, view=replace(plan.view, summary_tokens=folded.tokens))
        new = next_snapshot(loaded, folded.summary, plan, job)
        outcome = await self._saved(job, loaded, new, plan)
        return replace(outcome, restored=folded.restored)

    def _failed(self, job: Job, fallback: Outcome, started: float) -> Outcome:
        """``fallback`` marked as served after a failed summary, whose time the request's
        line reports (what made the turn slow, whatever its status says)."""
        current_record().summary_failed_s += self.clock() - started
        return replace(fallback, degraded="summary_failed")

    async def _saved(self, job: Job, loaded: Loaded, new: Snapshot, plan: Plan) -> Outcome:
        """Write ``new`` over ``loaded`` (compare-and-swap), keeping the snapshot it
        replaces as a rewind point, and show the history under it."""
        self.idle.succeeded(job.key)
        slots = slot_count(job.key, self.settings.session)
        await archive_span(self.archive, self.metrics, job, loaded, plan.view)  # first
        if await self.store.save(job.key, new):
            if loaded.stored is not None and slots > 1:
                await keep_rewind_point(self.store, job.key, loaded.stored, slots)
        else:
            # A concurrent writer got there first; its snapshot is as valid as ours.
            log.info("session=%s snapshot v%d lost a write race", job.key.log_id, new.version)
        handoff = Handoff(new.summary, new.version, self.settings.compaction.summary_role)
        outcome = rebuild_outcome(job.history, plan.view, handoff, job.budget)
        return replace(outcome, status="compacted")

    async def _wait_for_other(self, job: Job, loaded: Loaded) -> Outcome:
        """Another request is summarizing this session: wait (bounded), then use its result."""
        key = job.key
        before = loaded.version
        now = self.clock()
        # A wait on this lock already ran out: its holder is likely gone (a replica that
        # died mid-summary), so later turns do not wait it out again until it expires.
        record = self.memory.get(key)
        stalled = record is not None and record.stalled_until > now
        if not stalled:
            self.metrics.summary_waits.labels(kind="waited").inc()
        deadline = now + (0 if stalled else self.settings.compaction.wait_for_summary_s)
        degraded: Degraded | None = "summary_late"  # unless it lands, or is seen to fail
        while self.clock() < deadline:
            await self.sleep(_POLL_S)
            fresh = await load_snapshot(self.store, job.key, job.history)
            if fresh.stored is not None and fresh.version > before:
                loaded, degraded = fresh, None
                break
            # The holder may end without a snapshot (failed, cancelled): stop once it is free.
            probe = await self.store.acquire(key, _POLL_S)
            if probe is not None:
                await self.store.release(key, probe)
                fresh = await load_snapshot(self.store, job.key, job.history)  # saved since?
                if fresh.stored is not None and fresh.version > before:
                    loaded, degraded = fresh, None
                else:
                    degraded = "summary_failed"
                    current_record().summary_failed_s += self.clock() - now
                break
        else:
            if not stalled:
                lock_ttl = self._lock_ttl
                self.memory.of(key).stalled_until = self.clock() + lock_ttl
                log.warning(
                    "session=%s waited %.0f s for another summary; not waiting again for %.0f s",
                    job.key.log_id,
                    self.settings.compaction.wait_for_summary_s,
                    lock_ttl,
                )
        h, budget, role = job.history, job.budget, self.settings.compaction.summary_role
        view = loaded.view(h.pinned)
        if fits(h, view, budget):
            outcome = rebuild_outcome(h, view, Handoff.of(loaded, role), budget)
        else:
            outcome = self.trims.for_job(job, loaded)
        return replace(outcome, degraded=degraded)
