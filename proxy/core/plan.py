"""What stays verbatim, what gets elided, what gets summarised.

The upstream sees a *view* of the client's history (view.py): the pinned
messages, a summary of older ones, and a verbatim tail with old bulky tool
outputs elided. The plan chooses the view. Everything here is arithmetic over
precomputed per-message token counts: no I/O, no clock. Planning is linear in
the number of messages: every candidate view costs O(1) (``Totals``).

Cuts only fall on group starts, so an assistant's ``tool_calls`` and their
results are always summarised, elided or kept together, and the newest
message is never summarised, elided or dropped (invariant 4).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from proxy.core.budget import Budget
from proxy.core.history import History
from proxy.core.view import Totals, View, check_view, view_tokens


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one request.

    ``summarize`` is the ``[start, end)`` span to fold into the summary; an empty
    span means no model call. ``tokens`` is the request's estimated total
    (messages + fixed + reserve) under ``view``; ``fits`` says it is within the window.
    ``nothing_to_save``: a kept view past the trigger (or forced), because no compaction
    would make the request smaller (nothing bulky to elide, and a summary would cost at
    least what it replaces: a large pinned prefix beside the target).
    """

    action: Literal["keep", "compact"]
    view: View
    summarize: tuple[int, int]
    tokens: int
    fits: bool
    nothing_to_save: bool = False


def _is_group_start(results: Sequence[int], i: int) -> bool:
    # A result (even an orphan one) joins the group before it.
    return i == 0 or not results[i]


def _group_start_at_or_before(results: Sequence[int], i: int) -> int:
    while i > 0 and not _is_group_start(results, i):
        i -= 1
    return max(i, 0)


def protected_start(results: Sequence[int], budget: Budget) -> int:
    """Start of the recent tail that elision leaves alone: at least the newest message."""
    keep = max(budget.min_tail_messages, 1)
    return _group_start_at_or_before(results, max(len(results) - keep, 0))


def _plan(
    action: Literal["keep", "compact"],
    totals: Totals,
    view: View,
    budget: Budget,
    summarize: tuple[int, int],
) -> Plan:
    tokens = totals.tokens(view)
    return Plan(action, view, summarize, tokens, tokens <= budget.window)


def plan_compaction(
    history: History,
    current: View,
    budget: Budget,
    *,
    force: bool = False,
    settled: int | None = None,
) -> Plan:
    """Keep the current view, or compact it down to ``budget.target``, cheapest first.

    Under the trigger (and not forced) the view is kept as is, so the prefix the
    upstream sees stays byte-identical between compactions (invariant 5).
    Otherwise: (a) elide bulky tool outputs older than the protected recent tail;
    if that reaches the target, no model call is needed. (b) Else summarise up to
    the smallest legal cut that reaches the target, or the largest one that keeps
    the newest group when none does (``fits`` then says whether it is within the
    window). Summarising is skipped when it would not beat elision alone. Decided by
    tokens, not views: what would not make the request smaller is no compaction, and
    the view is kept (``nothing_to_save``).

    ``force`` compacts even under the trigger: it summarises at least everything
    before the protected tail (more when the target needs it), and keeps the view
    when nothing but the newest group is left to summarise.

    ``settled``: where messages the client re-sends begin (moves.py). Neither cut nor
    elision passes it, so the next history, which moves them on, still starts with what
    the new snapshot covers; unless only a plan past it fits the window.
    """
    if settled is not None and settled < len(history.messages) - 1:
        held = _planned(history, current, budget, force, max(settled, current.covered))
        if held.fits:
            return held
    return _planned(history, current, budget, force, len(history.messages))


def _planned(history: History, current: View, budget: Budget, force: bool, limit: int) -> Plan:
    """``plan_compaction`` with no cut or elision past ``limit``."""
    check_view(history, current)
    no_summary = (current.covered, current.covered)
    tokens = view_tokens(history, current, budget)
    over = tokens > budget.trigger
    keep = Plan("keep", current, no_summary, tokens, tokens <= budget.window)
    if not over and not force:
        return keep

    totals = Totals.build(history, budget)
    protected = min(protected_start(history.results, budget), limit)
    elided = replace(current, elide_before=max(current.elide_before, protected))
    elision_only = _plan("compact", totals, elided, budget, no_summary)
    elided_tokens = elision_only.tokens
    if over and elided_tokens <= budget.target:
        return elision_only
    # Without a summary worth its cost: elision alone if it saves tokens (a view that
    # differs yet is no smaller is no saving), else the view as it is.
    saves = elided_tokens < tokens
    lighter = elision_only if over and saves else replace(keep, nothing_to_save=over)

    cut = _choose_cut(totals, elided, budget, protected, force=force)
    if cut is not None and cut > limit:
        cut = _group_start_at_or_before(totals.results, limit)
        cut = cut if cut > elided.covered else None
    if cut is None:
        return lighter
    view = View(cut, budget.summary_allowance, elided.elide_before)
    plan = _plan("compact", totals, view, budget, (current.covered, cut))
    if not force and plan.tokens >= elided_tokens:
        # The new summary would cost more than it replaces.
        return lighter
    return plan


def _choose_cut(
    totals: Totals, elided: View, budget: Budget, protected: int, *, force: bool
) -> int | None:
    """The new ``covered``: the smallest legal cut reaching the target, else the largest.

    Each later cut keeps strictly fewer tokens verbatim, so the smallest cut that
    reaches the target also keeps the longest tail. ``None`` when no cut past
    ``elided.covered`` exists (only the newest group is left).
    """
    results = totals.results
    first = next_group_start(results, elided.covered + 1)
    if first is None:
        return None
    if force:
        # A forced compaction folds in at least everything before the protected tail.
        first = max(first, _group_start_at_or_before(results, protected))
    allowance, elide_before = budget.summary_allowance, elided.elide_before
    return first_within(
        results, first, lambda cut: totals.tokens(View(cut, allowance, elide_before)), budget.target
    )


def next_group_start(results: Sequence[int], i: int) -> int | None:
    """The first group start at or after ``i``; None when there is none.

    A cut at a group start ``c`` summarises messages before ``c`` and keeps the rest. A
    group is one message plus the tool results that follow it, so a cut never
    separates an assistant's ``tool_calls`` from their results.
    """
    while i < len(results) and not _is_group_start(results, i):
        i += 1
    return i if i < len(results) else None


def first_within(
    results: Sequence[int], first: int, tokens: Callable[[int], int], limit: int
) -> int:
    """The first group start from ``first`` (one itself) whose view is within ``limit``,
    else the last group start.

    Binary search over every index, no list of the cuts: with the summary's size fixed,
    a later cut moves more messages (each worth zero or more tokens) into the summary,
    so totals never rise, and the first group start within the limit is the first one
    at or after the first index within it.
    """
    n = len(results)
    i = first + bisect_left(range(first, n), True, key=lambda i: tokens(i) <= limit)
    found = next_group_start(results, i)
    return found if found is not None else _group_start_at_or_before(results, n - 1)
