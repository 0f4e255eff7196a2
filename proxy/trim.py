"""The deterministic fallback: drop whole oldest groups and mark the gap.

Used when summarization fails, times out or has nothing left to fold in while
the view is still over the window. No model call, nothing stored: the next
turn tries summarizing again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from proxy.budget import Budget
from proxy.count import History
from proxy.errors import ContextTooLarge
from proxy.outcome import Outcome
from proxy.plan import first_within, next_group_start, protected_start
from proxy.rebuild import SummaryRole, omitted_marker, rebuild_outcome
from proxy.snapshots import Loaded
from proxy.view import Totals, View, check_view, view_tokens

TRIM_MARKER_TOKENS: int = 30
"""Estimated tokens of the one-line marker that stands for trimmed messages."""


def trim_outcome(
    history: History, loaded: Loaded, budget: Budget, summary_role: SummaryRole
) -> Outcome:
    """The view with the oldest groups dropped until it fits; the history as it is when
    it already fits. Raises ``ContextTooLarge`` when even the newest message cannot."""
    results, counts, pinned = history.results, history.counts, history.pinned
    current = loaded.view(pinned)
    if view_tokens(counts, results, pinned, current, budget) <= budget.window:
        # It still fits as it is: forward without losing anything.
        return rebuild_outcome(
            history, current, loaded.summary, loaded.version, budget, summary_role
        )
    view = trim_plan(counts, results, pinned, current, budget, budget.target)
    dropped = view.covered - current.covered
    previous = loaded.summary
    summary = previous
    if dropped:
        marker = omitted_marker(dropped)
        summary = f"{previous}\n\n{marker}" if previous else marker
    outcome = rebuild_outcome(history, view, summary, loaded.version, budget, summary_role)
    outcome = replace(outcome, status="trimmed")
    if outcome.tokens + budget.reserve > budget.window:
        _raise_if_newest_too_large(history, budget)
    return outcome


def _raise_if_newest_too_large(history: History, budget: Budget) -> None:
    counts = history.counts
    newest = counts[-1] + sum(counts[: history.pinned]) + budget.fixed + budget.reserve
    if newest > budget.window:
        raise ContextTooLarge(
            f"This model's maximum context length is {budget.window} tokens. However, the "
            f"newest message alone needs about {newest} tokens with the system prompt, tool "
            "definitions and reserved output. Please reduce the length of the message.",
            param="messages",
        )


def trim_plan(
    counts: Sequence[int],
    results: Sequence[int],
    pinned: int,
    current: View,
    budget: Budget,
    limit: int,
) -> View:
    """Deterministic fallback when summarisation fails: drop whole oldest groups.

    Elides first, as ``plan_compaction`` does; then drops groups from
    ``current.covered`` onward, oldest first and never the newest group, until the
    view is within ``limit``. The dropped span is represented by a one-line marker
    (``TRIM_MARKER_TOKENS``) after the existing summary, if any. When even the
    newest group alone exceeds ``limit`` the smallest possible view is returned.
    """
    check_view(counts, results, pinned, current)
    totals = Totals.build(counts, results, pinned, budget)
    protected = protected_start(results, budget)
    view = replace(current, elide_before=max(current.elide_before, protected))
    if totals.tokens(view) <= limit:
        return view
    first = next_group_start(results, current.covered + 1)
    if first is None:
        return view
    carried = current.summary_tokens if current.covered > pinned else 0
    summary, elide_before = carried + TRIM_MARKER_TOKENS, view.elide_before
    cut = first_within(
        results, first, lambda cut: totals.tokens(View(cut, summary, elide_before)), limit
    )
    return View(cut, summary, elide_before)
