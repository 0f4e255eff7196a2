"""A view of one history, what the upstream sees of it, and its token total.

A view keeps the pinned messages, then (when ``covered > pinned``) a summary
of ``messages[pinned:covered]``, then the verbatim tail ``messages[covered:]``
in which old bulky tool outputs before ``elide_before`` are replaced by a short
placeholder. ``view_tokens`` is the definition of a view's total; ``Totals``
gives the same number in O(1) per view after one O(n) pass, which is what
makes planning (plan.py) and trimming (trim.py) linear.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress
from typing import TYPE_CHECKING

from proxy.core.history import History

if TYPE_CHECKING:  # for annotations: views read a budget's figures
    from proxy.core.budget import Budget

ELIDED_TOKENS: int = 110
"""Estimated tokens of an elision placeholder (message overhead included), with the
values it quotes (omitted.ELIDED_VALUE_CHARS: at most 160 characters, ~64 tokens)."""


@dataclass(frozen=True, slots=True)
class View:
    """What the upstream sees of one history.

    ``messages[pinned:covered]`` are replaced by the summary (``covered == pinned``
    means no summary); result messages before ``elide_before`` that are at least
    ``Budget.elide_min_tokens`` big are replaced by a placeholder.
    """

    covered: int
    summary_tokens: int
    elide_before: int


def elided(history: History, view: View, elide_min_tokens: int) -> Iterator[int]:
    """The messages that go upstream as an elision placeholder under ``view``, in order:
    bulky results (``elide_min_tokens`` or more) in the verbatim tail before
    ``view.elide_before``; never a pinned message and never the newest one. Only the
    window's results are looked at: a warm turn's tail is mostly other messages, and
    a look at each of them cost more than the rest of ``view_tokens``."""
    counts, results = history.counts, history.results
    end = min(view.elide_before, len(results) - 1)
    window = range(view.covered, end)
    return (
        i for i in compress(window, results[view.covered : end]) if counts[i] >= elide_min_tokens
    )


def view_tokens(history: History, view: View, budget: Budget) -> int:
    """Estimated total of the request under ``view``: messages + fixed + reserve.

    The summary's tokens count only when the view covers messages, exactly as
    ``rebuild_messages`` inserts the summary only then.
    """
    counts, pinned = history.counts, history.pinned
    total = sum(counts[:pinned]) + budget.fixed + budget.reserve
    if view.covered > pinned:
        total += view.summary_tokens
    total += sum(counts[view.covered :])
    # Only the elision window's results need a look; the rest is one sum.
    for i in elided(history, view, budget.elide_min_tokens):
        total += ELIDED_TOKENS - counts[i]
    return total


def fits(history: History, view: View, budget: Budget, limit: int | None = None) -> bool:
    """Whether the request under ``view`` is within ``limit`` tokens (by default the
    window): the one test of a view's size against a limit."""
    return view_tokens(history, view, budget) <= (budget.window if limit is None else limit)


# Totals keeps sums per block of this many messages, not per message: a 50k-message
# history would otherwise allocate 50k new ints on every plan, and a pass over
# freshly allocated memory that outgrows the caches costs more than ten small ones.
_BLOCK = 64


@dataclass(frozen=True, slots=True)
class Totals:
    """``view_tokens`` of any view of one history in O(1), after one O(n) pass.

    ``count_blocks[b]`` is the sum of ``counts`` before block ``b`` (``_BLOCK``
    messages each), ``saved_blocks[b]`` what eliding every bulky result before it
    saves; within a block the rest is summed when asked (at most ``_BLOCK`` messages).
    A view's total is then the pinned and verbatim spans less the savings inside
    ``[covered, elide_before)``.
    """

    pinned_and_fixed: int  # pinned messages + fixed + reserve: the same for every view
    pinned: int
    counts: Sequence[int]
    results: Sequence[int]
    elide_min: int
    count_blocks: list[int]
    saved_blocks: list[int]

    @classmethod
    def build(cls, history: History, budget: Budget) -> Totals:
        counts, results, pinned = history.counts, history.results, history.pinned
        if len(counts) != len(results):
            raise ValueError(f"{len(counts)} token counts for {len(results)} messages")
        elide_min = budget.elide_min_tokens
        starts = range(0, len(counts), _BLOCK)
        count_blocks = list(accumulate((sum(counts[b : b + _BLOCK]) for b in starts), initial=0))
        saved = (_saved(counts, results, b, b + _BLOCK, elide_min) for b in starts)
        fixed = sum(counts[:pinned]) + budget.fixed + budget.reserve
        return cls(
            fixed,
            pinned,
            counts,
            results,
            elide_min,
            count_blocks,
            list(accumulate(saved, initial=0)),
        )

    def _counts_before(self, i: int) -> int:
        b = i // _BLOCK
        return self.count_blocks[b] + sum(self.counts[b * _BLOCK : i])

    def _saved_before(self, i: int) -> int:
        """What eliding every bulky result among the first ``i`` messages saves."""
        b = i // _BLOCK
        within = _saved(self.counts, self.results, b * _BLOCK, i, self.elide_min)
        return self.saved_blocks[b] + within

    def tokens(self, view: View) -> int:
        """Equals ``view_tokens(history, view, budget)``."""
        n = len(self.counts)
        covered = min(view.covered, n)
        total = self.pinned_and_fixed + self.count_blocks[-1] - self._counts_before(covered)
        if view.covered > self.pinned:
            total += view.summary_tokens
        # The newest message is never elided.
        elide_end = min(view.elide_before, n - 1)
        if elide_end > covered:
            total -= self._saved_before(elide_end) - self._saved_before(covered)
        return total


def _saved(counts: Sequence[int], results: Sequence[int], start: int, end: int, least: int) -> int:
    """What eliding the results of at least ``least`` tokens in ``[start, end)`` saves."""
    bulky = compress(counts[start:end], results[start:end])
    return sum(n - ELIDED_TOKENS for n in bulky if n >= least)


def check_view(history: History, current: View) -> None:
    """Raise ``ValueError`` unless ``current`` is a view of ``history``."""
    counts, results, pinned = history.counts, history.results, history.pinned
    if len(counts) != len(results):
        raise ValueError(f"{len(counts)} token counts for {len(results)} messages")
    if not 0 <= pinned <= current.covered:
        raise ValueError(f"view covers from {current.covered} but {pinned} messages are pinned")
    if results and current.covered >= len(results):
        raise ValueError("the view covers the newest message")
