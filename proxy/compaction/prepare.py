"""Steps 3-5 for one turn, written once: its history counted, its budget, its session named
and that session's snapshot loaded. The pipeline's view (pipeline.py), shadow mode
(shadow.py) and the Messages ``count_tokens`` answer (routes/messages_count.py) each plan
from this prepared turn; what they do with it differs, how they get it does not.

Two halves, because ``count_tokens`` stops after the first when the next request would go
untouched: ``measure_turn`` (count and budget, no store) and ``locate_turn`` (the session
and its snapshot, one store read); ``prepare_turn`` is both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.compaction.count import count_history, session_of
from proxy.compaction.snapshots import load_session
from proxy.config import CompactionSettings, SessionSettings, Settings
from proxy.core.budget import Budget
from proxy.core.digest import tenant_seed
from proxy.core.history import History
from proxy.core.outcome import Turn
from proxy.core.session import SessionKey, slot_count
from proxy.core.snapshot import Loaded
from proxy.core.tokens import TokenCounter, output_reserve
from proxy.observe.metrics import Metrics
from proxy.store import Snapshots


@dataclass(frozen=True, slots=True)
class Measured:
    """A turn's compaction settings (its tenant's), its history counted (step 5) and the
    budget its model's window leaves it."""

    c: CompactionSettings
    history: History
    budget: Budget


@dataclass(frozen=True, slots=True)
class Prepared:
    """A measured turn with its session: the one it names or derives (step 3), the slot
    of it whose snapshot the history may use, and that snapshot, checked (step 4)."""

    c: CompactionSettings
    history: History
    budget: Budget
    session: SessionKey
    key: SessionKey
    loaded: Loaded


async def measure_turn(
    turn: Turn, counters: dict[str, TokenCounter], default: CompactionSettings
) -> Measured:
    """``turn`` counted with its model's tokenizer, under its tenant's compaction settings
    (else ``default``), and the output its request reserves taken from the window."""
    c, model = turn.compaction(default), turn.model
    reserve = output_reserve(turn.chat, model.max_output_tokens)
    history = await count_history(counters[model.tokenizer], turn, c, tenant_seed(turn.tenant))
    budget = Budget.for_model(model, c, reserve, history.fixed)
    own = None if turn.trigger is None else turn.trigger + reserve  # its input, and the reply
    if own is not None and own < budget.trigger:  # the request's own threshold is lower
        target = int(own * c.target_ratio / c.trigger_ratio)
        budget = replace(budget, trigger=own, target=min(budget.target, target))
    return Measured(c, history, budget)


async def locate_turn(
    turn: Turn,
    measured: Measured,
    store: Snapshots,
    sessions: SessionSettings,
    metrics: Metrics | None = None,
) -> Prepared:
    """``measured``'s session, its slot in ``store`` and the snapshot there; with
    ``metrics``, slots that held snapshots none of which matched are counted."""
    history = measured.history
    session = await session_of(turn, history.messages)
    slots = slot_count(session, sessions)
    missed = None if metrics is None else _missed(metrics)
    key, loaded = await load_session(store, session, history, slots, missed)
    budget = measured.budget
    if loaded.side:  # compacts only what does not fit: its conversation's turns do the rest
        budget = replace(budget, trigger=budget.window)
    return Prepared(measured.c, history, budget, session, key, loaded)


async def prepare_turn(
    turn: Turn,
    counters: dict[str, TokenCounter],
    store: Snapshots,
    settings: Settings,
    metrics: Metrics | None = None,
) -> Prepared:
    """``turn`` measured, then located (both halves, the module's doc)."""
    measured = await measure_turn(turn, counters, settings.compaction)
    return await locate_turn(turn, measured, store, settings.session, metrics)


def _missed(metrics: Metrics) -> Callable[[str], object]:
    misses = metrics.slot_misses
    return lambda outcome: misses.labels(outcome=outcome).inc()
