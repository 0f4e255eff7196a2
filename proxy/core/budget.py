"""How many tokens one request may use, and how long its summary may be.

Every figure is in the proxy's own token units: the model's window has already
been calibrated and learned for the tenant (``Services.effective_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations: a budget is figures, built from these
    from proxy.config import CompactionSettings
    from proxy.core.models import ResolvedModel

FRAME_TOKENS = 60
"""Framing tokens around a summary: the handoff text and the acknowledgement turn."""

MIN_SUMMARY_TOKENS = 128
"""The shortest summary the proxy asks for: shorter holds too little to replace a span."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Token limits for one request; every figure is in tokens."""

    window: int
    reserve: int  # output reserved for the reply
    fixed: int  # outside the messages: tool definitions, response_format schema
    trigger: int  # compact when the view's total exceeds this...
    target: int  # ...down to at most this (hysteresis: target < trigger)
    summary_allowance: int  # a new summary with its framing
    min_tail_messages: int = 4
    elide_min_tokens: int = 400
    # Most values quoted into a summary or a trimmed view's digest (omitted.py).
    quoted_values_max: int = 64
    # Kept free for recall's excerpts (compaction/recall.py) when a trimmed view's cut is
    # reused: a cut kept until the view fills the window would leave them no room.
    recall: int = 0

    @classmethod
    def for_model(
        cls, model: ResolvedModel, settings: CompactionSettings, reserve: int, fixed: int
    ) -> Budget:
        """The budget of a request to ``model`` that reserves ``reserve`` tokens for the
        reply and spends ``fixed`` outside its messages."""
        window = model.context_window
        return cls(
            window=window,
            reserve=reserve,
            fixed=fixed,
            trigger=int(window * settings.trigger_ratio),
            target=int(window * settings.target_ratio),
            summary_allowance=summary_limit(model, settings) + FRAME_TOKENS,
            min_tail_messages=settings.min_tail_messages,
            elide_min_tokens=settings.elide_min_tokens,
            quoted_values_max=settings.restored_identifiers_max,
            recall=int(window * settings.recall_budget_ratio),
        )


def summary_limit(model: ResolvedModel, settings: CompactionSettings) -> int:
    """How long a summary may be: the configured maximum, but never so much of a
    small window that no recent turn could stay verbatim beside it: at most
    ``summary_budget_ratio`` of it (by default 0.15: about 600 tokens of a 4k window)."""
    share = int(model.context_window * settings.summary_budget_ratio)
    return max(min(settings.summary_max_tokens, share), MIN_SUMMARY_TOKENS)
