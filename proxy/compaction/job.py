"""A compaction to carry out: the request whose plan compacts, and what asked for it.

Built only when a plan compacts or has nothing to save (pipeline.py), or after an
answer for a background pre-compaction (precompact.py); carried out by the
``Compactor`` (compact.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.core.budget import Budget
from proxy.core.history import History
from proxy.core.outcome import Turn
from proxy.core.session import SessionKey

# What made a session compact: crossing the trigger ratio, X-Compaction: force, the
# upstream rejecting the request as too long, POST /sessions/{id}/compact, or crossing
# the pre-compaction ratio (in the background, after an answer: precompact.py).
Trigger = Literal["threshold", "forced", "overflow_recovery", "scheduled", "precompact"]


def trigger_for(*, recover: bool, scheduled: bool, forced: bool) -> Trigger | None:
    """What asks for a compaction now, whatever the threshold says (None: nothing);
    a recovery first, since it compacts whatever else was asked."""
    if recover:
        return "overflow_recovery"
    if scheduled:
        return "scheduled"
    return "forced" if forced else None


@dataclass(frozen=True, slots=True)
class Job:
    """One request whose plan compacts (or saves nothing): built only then, never on the
    hot path."""

    turn: Turn
    key: SessionKey
    history: History
    budget: Budget
    trigger: Trigger
    # Pre-compaction after an answer (precompact.py): nobody waits for it, nor does it wait.
    background: bool = False

    @property
    def force(self) -> bool:
        """Planned with force: something asked for this compaction, not a ratio."""
        return self.trigger not in ("threshold", "precompact")
