"""Step 4: the session's snapshot, loaded and checked against the history it is for.

What a history may use of a snapshot is core/snapshot.py's (``Loaded``,
``loaded_for``); this loads it from the store, finds the session's slot (one
per conversation under a name or a derived id), keeps the snapshot a compaction
replaced as a rewind point, and stamps the snapshot that replaces it
(``next_snapshot``), archiving the originals it newly covers first (``archive_span``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from proxy.compaction.archiving import write_archive
from proxy.compaction.job import Job
from proxy.core.digest import prefix_hash
from proxy.core.history import History
from proxy.core.moves import seen_record
from proxy.core.passages import archived_messages
from proxy.core.plan import Plan
from proxy.core.session import SessionKey, session_slots
from proxy.core.snapshot import Loaded, Snapshot, body_hash, loaded_for, side_of
from proxy.core.view import View, elided
from proxy.observe.metrics import Metrics
from proxy.store import Archive, Snapshots

log = logging.getLogger("proxy.compaction")


async def load_snapshot(store: Snapshots, key: SessionKey, history: History) -> Loaded:
    """The session's snapshot, and what of it ``history`` may use: as its own, or as a
    side request's over another conversation (``side_of``: never to be replaced by it)."""
    stored = await store.load(key)
    loaded = loaded_for(stored, history)
    if loaded.valid is None and (side := side_of(stored, history)) is not None:
        return Loaded(stored, side, side=True)  # a side request over its conversation
    if stored is not None and loaded.valid is None:
        log.info(
            "session=%s snapshot v%d no longer matches the history; re-planning",
            key.log_id,
            stored.version,
        )
    return loaded


async def load_session(
    store: Snapshots,
    key: SessionKey,
    history: History,
    slots: int,
    missed: Callable[[str], object] | None = None,
) -> tuple[SessionKey, Loaded]:
    """Where ``history``'s snapshot lives, and the snapshot. A session (``key``, named or
    derived) has ``slots``, shared by every conversation under it: the newest one whose
    snapshot this history starts with, else an empty one, else the least recently
    updated (a conversation long gone, most likely). A side request (``side_of``: its own
    pinned messages over another slot's conversation) is shown under that conversation's
    snapshot, and would compact into a slot of its own. A conversation whose client
    moved messages it re-sends (moves.py) keeps its own slot even where its snapshot no
    longer applies. When slots hold snapshots and none matches exactly, ``missed`` hears
    which: "side", "moved", "free" or "evicted"."""
    keys = session_slots(key, slots)
    if len(keys) == 1:
        return key, await load_snapshot(store, key, history)
    stored = await store.load_many(keys)
    at, loaded, miss = _slot_for(stored, history)
    if miss is not None and missed is not None and (miss != "free" or any(stored)):
        missed(miss)
    if miss == "evicted":
        log.info("session=%s no snapshot matches the history; re-planning", key.log_id)
    return keys[at], loaded


def _slot_for(stored: list[Snapshot | None], history: History) -> tuple[int, Loaded, str | None]:
    """``load_session``'s choice among the session's ``stored`` snapshots: the slot, the
    snapshot as ``history`` may use it, and the miss to count (None: an exact match)."""
    ages = [-s.updated_at if s is not None else 0.0 for s in stored]
    newest = sorted(range(len(stored)), key=ages.__getitem__)  # empty slots last
    loaded: dict[int, Loaded] = {}  # checked newest first, up to the first that applies
    for i in newest:
        loaded[i] = loaded_for(stored[i], history)
        if loaded[i].valid is not None:
            return i, loaded[i], None
    if (side := _side_slot(stored, newest, history)) is not None:
        return side
    if (moved := next((i for i in newest if loaded[i].settled is not None), None)) is not None:
        return moved, loaded[moved], "moved"
    if None in stored:
        return stored.index(None), Loaded(None, None), "free"
    return newest[-1], Loaded(stored[newest[-1]], None), "evicted"


def _side_slot(
    stored: list[Snapshot | None], newest: list[int], history: History
) -> tuple[int, Loaded, str] | None:
    """A side request's slot: shown under the newest snapshot it is a side of, its own
    slot, should it compact, a free one, else the stalest but that snapshot's."""
    for i in newest:
        if (side := side_of(stored[i], history)) is not None:
            own = stored.index(None) if None in stored else [j for j in newest if j != i][-1]
            return own, Loaded(stored[own], side, side=True), "side"
    return None


async def keep_rewind_point(store: Snapshots, key: SessionKey, old: Snapshot, slots: int) -> None:
    """``key``'s snapshot just moved on from ``old``: keep ``old`` in a free slot of the
    session, so a client that rewinds past the new cut (edits an earlier message,
    regenerates an answer) still finds a snapshot its history starts with. A free slot
    only, never another conversation's; the copy starts that slot's versions over."""
    keys = [k for k in session_slots(key, slots) if k != key]
    stored = await store.load_many(keys)
    if None in stored:
        copy = replace(old, version=1, compact_requested_at=0.0)
        await store.save(keys[stored.index(None)], copy)


def next_snapshot(loaded: Loaded, summary: str, plan: Plan, job: Job) -> Snapshot:
    """The snapshot that replaces ``loaded.stored``: ``summary`` under ``plan.view``,
    anchored to ``job.history``, for ``job``'s model. Clears a scheduled compaction:
    this is it."""
    history, budget, now = job.history, job.budget, time.time()
    view = plan.view
    old = loaded.stored
    anchor = max(view.covered, view.elide_before)
    return Snapshot(
        version=loaded.version + 1,
        summary=summary,
        pinned=history.pinned,
        covered=view.covered,
        elide_before=view.elide_before,
        anchor_hash=prefix_hash(history.digests, anchor),
        summary_tokens=view.summary_tokens,
        tokens_before=sum(history.counts) + budget.fixed + budget.reserve,
        tokens_after=plan.tokens,
        created_at=old.created_at if old and old.created_at else now,
        updated_at=now,
        model=job.turn.model.name,
        seen=seen_record(history.digests, anchor, history.pinned),
        body_hash=body_hash(history.digests, history.pinned, anchor),
    )


def newly_covered(job: Job, old: View, new: View) -> list[int]:
    """The positions of ``job.history`` that ``new`` takes out of the upstream's sight
    and ``old`` (the view the history had) did not: summarized or elided."""
    h, elide_min = job.history, job.budget.elide_min_tokens
    shown_before = set(range(old.covered, len(h.messages))) - set(elided(h, old, elide_min))
    gone = set(range(h.pinned, new.covered)) | set(elided(h, new, elide_min))
    return sorted(gone & shown_before)


async def archive_span(
    archive: Archive | None, metrics: Metrics, job: Job, loaded: Loaded, new: View
) -> None:
    """Archive what ``new`` newly covers of ``job``'s history (``loaded``'s view had it in
    sight), under the session's name (``slot_base``: every slot's conversation in one
    archive, which recall reads); count what happened. Before the snapshot is written:
    a replica that reads the snapshot finds its originals archived. A write that loses
    the snapshot's race leaves originals the winner archives too (recall indexes them
    once); a failing one is counted and logged, and the turn goes on."""
    if archive is None or job.key.shadow:
        return  # shadow mode sent everything: nothing left the model's sight
    positions = newly_covered(job, loaded.view(job.history.pinned), new)
    if not positions:
        return
    messages = job.history.messages
    digests = [job.history.digests[i] for i in positions]
    originals = archived_messages([messages[i] for i in positions], positions, digests)
    await write_archive(archive, metrics, job.key, originals)
