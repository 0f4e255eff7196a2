"""Steps 3-8 for most requests: far below the trigger, the body goes as it came.

A body whose size in bytes bounds its tokens (core/tokens.py ``bounded_by``) below the
trigger, and below the pre-compaction threshold where the model has one, can neither
be compacted nor start a background compaction: it needs no count, no session and no
store read. Only something that asks for a compaction regardless makes it look further:
``X-Compaction: force``, an overflow's recovery, or a compaction scheduled on this
replica (``Schedule.take_hint``, which a look consumes). A plain function, not a step
of its own: the pipeline calls it before any coroutine of steps 3-8 (issue 27).
"""

from __future__ import annotations

from proxy.compaction.schedule import Schedule
from proxy.config import CompactionSettings
from proxy.core.outcome import Outcome, Turn
from proxy.core.tokens import bounded_by, output_reserve


def far_below(
    turn: Turn, default: CompactionSettings, schedule: Schedule, pressed: bool
) -> Outcome | None:
    """``turn``'s body as sent when it is far below its thresholds (under its tenant's
    compaction settings, else ``default``) and nothing asks for a compaction
    (``pressed``: forced or recovering; a hint of ``schedule``'s, which this takes).
    None: steps 3-8 must look."""
    c = turn.compaction(default)
    chat, model = turn.chat, turn.model
    reserve = output_reserve(chat, model.max_output_tokens)
    soonest = (c.precompact.ratio if model.precompact else None) or c.trigger_ratio
    limit = int(model.context_window * soonest) - reserve  # bytes bound no item by reference
    limit = limit if turn.trigger is None else min(limit, turn.trigger)
    below = not turn.references and bounded_by(turn.body, chat["messages"], limit)
    hinted = schedule.take_hint(turn.tenant, turn.session_header)
    if below and not (pressed or hinted):
        return Outcome.passthrough(turn.body, model.context_window)
    return None
