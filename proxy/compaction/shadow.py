"""Shadow mode (``compaction.mode: shadow``, or ``X-Compaction: shadow``): every
compaction the proxy would make, planned as steps 3-8 plan it, while the request goes
upstream byte-identical to what the client sent.

The plans run against snapshots of their own, filed apart from the live ones
(``SessionKey.shadow``: ``{prefix}:shadow-snap:...`` in Redis, store/keys.py), so a
conversation's shadow compactions follow each other as live ones would (a snapshot
applied until the next cut), and the live path never reads one. Without
``compaction.shadow_summarize`` a shadow snapshot holds no summary, only where it would
cut and the summary's planned size; with it, the summary is asked for as a live one is
(at its cost, in the ledger's summarizer tokens) and kept there, to be read through
``GET /sessions/{id}`` (``shadow``) and checked offline: never applied. A failed shadow
summary saves nothing (``failed``); no back-off, no background pre-compaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from proxy.compaction.compact import CompactionStore, Compactor
from proxy.compaction.job import Job
from proxy.compaction.prepare import prepare_turn
from proxy.compaction.snapshots import next_snapshot
from proxy.core.outcome import Outcome, Shadow, ShadowStatus, Turn
from proxy.core.plan import Plan, plan_compaction
from proxy.core.session import SessionKey
from proxy.core.snapshot import Loaded, Snapshot
from proxy.core.view import view_tokens
from proxy.errors import SummaryError
from proxy.observe.record import current_record

log = logging.getLogger("proxy.compaction")


@dataclass(frozen=True, slots=True)
class ShadowStore:
    """``store``'s snapshots and locks under the shadow keys of the sessions asked for."""

    store: CompactionStore

    async def load(self, key: SessionKey) -> Snapshot | None:
        return await self.store.load(replace(key, shadow=True))

    async def load_many(self, keys: Sequence[SessionKey]) -> list[Snapshot | None]:
        return await self.store.load_many([replace(k, shadow=True) for k in keys])

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        return await self.store.save(replace(key, shadow=True), snapshot)

    async def delete(self, key: SessionKey) -> bool:
        return await self.store.delete(replace(key, shadow=True))

    async def list_sessions(self, limit: int) -> list[tuple[SessionKey, Snapshot]]:
        return []  # shadow snapshots are read per session, never listed


async def shadow_outcome(
    compactor: Compactor, turn: Turn, force: Callable[[SessionKey], bool] | None = None
) -> Outcome:
    """``turn`` forwarded as the client sent it (status ``shadow``), with what steps 3-8
    would have sent instead (``Outcome.shadow``); a compaction they would make is
    planned, and with ``shadow_summarize`` summarized, into the shadow snapshot.
    ``force``: ``X-Compaction: force``'s rate limit (``Schedule.may_force``), when asked."""
    # Located by the live session's key, which ShadowStore maps to its shadow snapshots.
    store, counters = ShadowStore(compactor.store), compactor.counters
    p = await prepare_turn(turn, counters, store, compactor.settings)
    history, budget, key, loaded = p.history, p.budget, p.key, p.loaded
    current_record().counted(key, history)
    forced = force is not None and force(key)  # a client buys summaries at most so often
    view = loaded.view(history.pinned)
    plan = plan_compaction(history, view, budget, force=forced, settled=loaded.settled)
    job = Job(turn, key, history, budget, "forced" if forced else "threshold")
    before = sum(history.counts) + history.fixed
    shadow = Shadow("passthrough", loaded.version, before, (0, 0), before)
    if plan.action == "compact" and not plan.nothing_to_save:
        shadow = await _compact(compactor, job, loaded, plan, replace(shadow, status="compacted"))
    if shadow.status != "compacted":  # the view as the shadow snapshot leaves it
        tokens, trimmed = _kept(compactor, job, loaded)
        kept: ShadowStatus = "snapshot" if loaded.valid else "passthrough"
        kept = "trimmed" if trimmed else kept
        shadow = replace(shadow, status="failed" if shadow.status == "failed" else kept)
        shadow = replace(shadow, tokens=tokens)
    return replace(Outcome.unchanged(before, budget.window), status="shadow", shadow=shadow)


def _kept(compactor: Compactor, job: Job, loaded: Loaded) -> tuple[int, bool]:
    """The tokens of the view without a new compaction: the shadow snapshot as it is, or
    trimmed (True) when that no longer fits."""
    h, budget = job.history, job.budget
    tokens = view_tokens(h, loaded.view(h.pinned), budget)
    if tokens <= budget.window:
        return tokens - budget.reserve, False
    shadow_key = replace(job.key, shadow=True)  # its own sticky cuts, not the live ones
    return compactor.trims.outcome(shadow_key, h, loaded, budget, reuse=True).tokens, True


async def _compact(
    compactor: Compactor, job: Job, loaded: Loaded, plan: Plan, shadow: Shadow
) -> Shadow:
    """``shadow`` after the plan of ``job`` is carried out into the shadow snapshot: what
    it would send (its version, tokens) and the summary would cost (input, output: the
    proxy's counts; a summary actually asked for, its size); status ``failed`` when the
    summary asked for failed (nothing saved)."""
    h, budget = job.history, job.budget
    start, end = plan.summarize
    # The summarizer reads the span and the summary it extends, writes the new one.
    given = sum(h.counts[start:end]) + loaded.view(h.pinned).summary_tokens
    spent, summary = (given, plan.view.summary_tokens), ""
    if start == end:  # elision alone: no summarizer call, the summary it has kept
        spent, summary = (0, 0), loaded.summary or ""
    elif compactor.settings.compaction.shadow_summarize:
        folded = await _summarize(compactor, job, loaded, plan)
        if folded is None:  # another request is summarizing it, or over a cap: as it is
            return replace(shadow, status="passthrough")
        if isinstance(folded, str):
            return replace(shadow, status="failed", summarizer=spent)
        summary, tokens = folded
        plan = replace(plan, view=replace(plan.view, summary_tokens=tokens))
        spent = (spent[0], tokens)
    # else planned, not summarized: where it would cut, and the summary's planned size
    new = next_snapshot(loaded, summary, plan, job)
    # A lost race (False): another request's snapshot is as good.
    await ShadowStore(compactor.store).save(job.key, new)
    tokens = view_tokens(h, plan.view, budget) - budget.reserve
    return replace(shadow, version=new.version, tokens=tokens, summarizer=spent)


async def _summarize(
    compactor: Compactor, job: Job, loaded: Loaded, plan: Plan
) -> tuple[str, int] | Literal["failed"] | None:
    """The summary of ``plan.summarize`` folded into ``loaded``'s, and its tokens;
    ``failed``; None when another request holds the session's shadow lock, or the
    tenant is over a cap (caps.py: counted in ``tenant_capped_total``, none asked for)."""
    shadow_key = replace(job.key, shadow=True)
    token = await compactor.store.acquire(
        shadow_key, compactor.settings.compaction.summary_timeout_s
    )
    if token is None:
        return None
    folder = compactor.folder  # its pace learned from and used for every summary
    start, end = plan.summarize
    caps = compactor.caps
    try:
        if caps is not None and await caps.admit(job.turn):
            return None
        span = job.history.messages[start:end]
        fold = folder.fold(job, loaded.summary, span)  # its job is no background one
        folded = await (fold if caps is None else caps.spending(job.turn, fold))
    except SummaryError as exc:
        log.warning("session=%s shadow summary failed (%s)", job.key.log_id, exc)
        return "failed"
    finally:
        await compactor.store.release(shadow_key, token)
    return "failed" if folded is None else (folded.summary, folded.tokens)
