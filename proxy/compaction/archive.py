"""The archive's write: once per compaction, the originals of the span its new snapshot
newly covers (summarized, or elided as a bulky tool output) go to the store beside the
snapshot (``store.Archive``), verbatim.

Written before the snapshot, so a replica that reads the new snapshot finds its
originals archived; a write that loses the snapshot's race leaves originals the winner
archives too, which the index keeps once (recall.py). A failing write never fails the
turn: it is counted and logged, and the turn is served as it would have been.
"""

from __future__ import annotations

import logging

from proxy.compaction.job import Job
from proxy.core.passages import archived_messages
from proxy.core.view import View, elided
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Archive

log = logging.getLogger("proxy.compaction")


def newly_covered(job: Job, old: View, new: View) -> list[int]:
    """The positions of ``job.history`` that ``new`` takes out of the upstream's sight
    and ``old`` (the view the history had) did not: summarized or elided."""
    h, elide_min = job.history, job.budget.elide_min_tokens
    shown_before = set(range(old.covered, len(h.messages))) - set(elided(h, old, elide_min))
    gone = set(range(h.pinned, new.covered)) | set(elided(h, new, elide_min))
    return sorted(gone & shown_before)


async def archive_span(store: Archive, metrics: Metrics, job: Job, old: View, new: View) -> None:
    """Archive what ``new`` newly covers of ``job``'s history; count what happened."""
    if job.key.shadow:
        return  # shadow mode sent everything: nothing left the model's sight
    positions = newly_covered(job, old, new)
    if not positions:
        return
    messages = job.history.messages
    originals = archived_messages([messages[i] for i in positions], positions)
    try:
        dropped = await store.archive(job.key, originals)
    except StoreError as exc:
        metrics.archive_writes.labels(outcome="failed").inc()
        log.warning("session=%s archive write failed (%s)", job.key.log_id, exc)
        return
    metrics.archive_writes.labels(outcome="archived").inc()
    metrics.archived_messages.inc(len(originals))
    if dropped.session:
        metrics.archive_dropped_bytes.labels(bound="session").inc(dropped.session)
    if dropped.tenant:
        metrics.archive_dropped_bytes.labels(bound="tenant").inc(dropped.tenant)
