"""Sessions the proxy has seen, so ``GET /sessions/{id}`` answers before a first compaction.

A client checking that its session header is recognised should not have to wait
for a summary. Each turn of a named session (header or body field; a derived
session has no id to ask by) leaves a ``Sighting`` in the store: its message
count, the tokens sent upstream, its model. Noting costs the request nothing:
``note`` is an in-memory check that returns the write as a follow-up, which the
pipeline runs once the answer is out (before pre-compaction's), and a process writes
a session's sighting at most once per ``REFRESH_S``: on first sight, then as it
keeps going. A write that fails costs nothing but a stale figure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from proxy.compaction.memory import SessionMemory
from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.core.session import SessionKey, session_from_header
from proxy.errors import StoreError
from proxy.store import Sighting, Sightings

log = logging.getLogger("proxy.store")

# At most one write per session per process this often: GET /sessions/{id} figures
# may lag a busy session's turns by this much.
REFRESH_S = 10.0


class SessionSightings:
    """Which named sessions this replica noted in the store lately."""

    def __init__(
        self,
        store: Sightings,
        *,
        memory: SessionMemory | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._wall = wall
        self._clock = clock
        # Until when each session's sighting is fresh: its record's ``sighted_until``.
        self._memory = memory if memory is not None else SessionMemory()

    def note(self, turn: Turn, outcome: Outcome) -> FollowUp | None:
        """The write of ``turn``'s sighting (sent as ``outcome``), to follow its answer;
        None when none is due. O(1): a hash of the session's name and a dictionary lookup."""
        if turn.session_header is None:
            return None
        key = session_from_header(turn.tenant, turn.session_header)
        record = self._memory.get(key)
        if record is not None and record.sighted_until > self._clock():
            return None
        n = len(turn.chat["messages"])
        sighting = Sighting(n, outcome.tokens, turn.model.name, self._wall())
        return partial(self._write, key, sighting)

    async def _write(self, key: SessionKey, sighting: Sighting) -> None:
        # Marked when written, not when offered: a turn whose answer failed (or that
        # recovered from an overflow with a new view) leaves the next turn due.
        self._memory.of(key).sighted_until = self._clock() + REFRESH_S
        try:
            await self._store.note_seen(key, sighting)
        except StoreError as exc:  # a bare remote store; the resilient one never raises
            log.warning("session=%s not noted as seen (%s)", key.log_id, exc)
