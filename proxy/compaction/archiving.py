"""Writing the archive of originals: a compaction's newly covered span (snapshots.py,
before its snapshot) and a trimmed view's newly dropped turns (recall.py, off the
request's path: ``ArchiveWrites``). Both counted the same way (``write_archive``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.core.session import SessionKey, slot_base
from proxy.errors import StoreError

if TYPE_CHECKING:  # annotations only: the import chain stays short
    from proxy.core.passages import Original
    from proxy.observe.metrics import Metrics
    from proxy.store import Archive

log = logging.getLogger("proxy.compaction")

# Background writes under way at once (past that one is skipped and counted: recall still
# has the turns from the request, and the next trimmed turn that drops more writes those),
# and how long shutdown waits for them.
WRITES = 32
CLOSE_S = 2.0


async def write_archive(
    archive: Archive, metrics: Metrics, key: SessionKey, originals: Sequence[Original]
) -> None:
    """Append ``originals`` to the archive of ``key``'s session (``slot_base``), counted;
    a failing write is logged too, and whoever wrote goes on without it."""
    try:
        dropped = await archive.archive(slot_base(key), originals)
    except StoreError as exc:
        metrics.archive.writes.labels(outcome="failed").inc()
        log.warning("session=%s archive write failed (%s)", key.log_id, exc)
        return
    metrics.archive.writes.labels(outcome="archived").inc()
    metrics.archive.messages.inc(len(originals))
    if dropped.session:
        metrics.archive.dropped_bytes.labels(bound="session").inc(dropped.session)
    if dropped.tenant:
        metrics.archive.dropped_bytes.labels(bound="tenant").inc(dropped.tenant)


class ArchiveWrites:
    """Archive writes the request that caused them does not wait for."""

    def __init__(self, archive: Archive, metrics: Metrics) -> None:
        self._archive = archive
        self._metrics = metrics
        self._skipped = metrics.archive.writes.labels(outcome="skipped")
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, key: SessionKey, originals: Sequence[Original]) -> None:
        if len(self._tasks) >= WRITES:
            self._skipped.inc()
            return
        task = asyncio.create_task(write_archive(self._archive, self._metrics, key, originals))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Let the writes under way finish (shutdown: the store closes next)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_S)
