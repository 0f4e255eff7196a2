"""The deterministic fallback: drop whole oldest groups, mark the gap, keep their values.

Used when summarization fails, times out, is backed off (backoff.py) or has
nothing left to fold in while the view is still over the window. No model call,
nothing stored: the next turn (past any back-off) tries summarizing again. The
marker is followed by a recap of the values the dropped messages held
(omitted.py), within a summary's budget and within the room the trim leaves:
when the recap does not fit beside the kept turns, one more group is dropped
for it, never past the window.

A trim drops down to ``budget.target``, and its ``Cut`` (the view and the recap's
text) is handed back for the caller to keep (sticky.py): the next turn of the same
history reuses it while it fits the window, so the upstream sees the same prefix,
byte for byte, turn after turn (a provider's prefix cache hits, DESIGN.md invariant
5), and only re-trims, again to the target, once it no longer fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxy.core.budget import FRAME_TOKENS, Budget
from proxy.core.digest import prefix_hash
from proxy.core.history import History
from proxy.core.identifiers import split_carried
from proxy.core.omitted import omitted_recap, recap_chars, recap_tokens
from proxy.core.outcome import Outcome
from proxy.core.plan import first_within, next_group_start, protected_start
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.core.snapshot import Loaded
from proxy.core.view import Totals, View, check_view, fits, view_tokens
from proxy.core.wording import SummaryRole, omitted_marker
from proxy.errors import ContextTooLarge

TRIM_MARKER_TOKENS: int = 30
"""Estimated tokens of the one-line marker that stands for trimmed messages."""
QUOTED_FRAME_TOKENS: int = 40
"""Estimated tokens around a recap: its heading, and after a system handoff the user
turn's introduction and the acknowledgement (rebuild.py)."""


@dataclass(frozen=True, slots=True)
class Cut:
    """A trimmed view as served, for the next turn to reuse: trimmed from snapshot
    ``version``'s view (covering up to ``start``) to ``view``, whose dropped span
    ``recap`` quotes; ``prefix``: ``digest.prefix_hash`` of the messages before
    ``view.covered``, so a history that no longer starts with them is not served it."""

    version: int
    start: int
    view: View
    prefix: str
    recap: str


def trim_outcome(
    history: History, loaded: Loaded, budget: Budget, summary_role: SummaryRole
) -> Outcome:
    """The view with the oldest groups dropped until it fits; the history as it is when
    it already fits. Raises ``ContextTooLarge`` when even the newest message cannot."""
    return trimmed(history, loaded, budget, summary_role, None)[0]


def trimmed(
    history: History,
    loaded: Loaded,
    budget: Budget,
    summary_role: SummaryRole,
    previous: Cut | None,
) -> tuple[Outcome, Cut | None]:
    """``trim_outcome``, reusing ``previous`` (the last turn's cut) while this history
    still starts with what it dropped and its view still fits the window; with the cut
    served (None when nothing was trimmed)."""
    current = loaded.view(history.pinned)
    if fits(history, current, budget):
        # It still fits as it is: forward without losing anything.
        return rebuild_outcome(history, current, Handoff.of(loaded, summary_role), budget), None
    cut = previous if previous and _reusable(history, loaded, budget, previous) else None
    if cut is None:
        view, recap = trim_plan(history, current, budget, budget.target), ""
        if view.covered > current.covered:
            view, recap = _with_recap(history, loaded, current, view, budget)
        prefix = prefix_hash(history.digests, view.covered)
        cut = Cut(loaded.version, current.covered, view, prefix, recap)
    view, recap = cut.view, cut.recap
    summary = loaded.summary
    if view.covered > current.covered:
        summary = _trimmed_summary(loaded.summary, view.covered - current.covered, recap)
    handoff = Handoff(summary, loaded.version, summary_role)
    outcome = rebuild_outcome(history, view, handoff, budget)
    outcome = replace(outcome, status="trimmed")
    if outcome.tokens + budget.reserve > budget.window:
        _raise_if_newest_too_large(history, budget)
    return outcome, cut


def _reusable(history: History, loaded: Loaded, budget: Budget, cut: Cut) -> bool:
    """Whether ``cut`` still applies to ``history`` under ``loaded`` and fits the window
    (less the room recall's excerpts may take):
    same snapshot, the same messages before its cut (their per-message digests), a cut
    that still starts a group, the newest message kept."""
    h, covered = history, cut.view.covered
    return (
        cut.version == loaded.version
        and cut.start == loaded.view(h.pinned).covered
        and covered < len(h.messages)
        and (covered == 0 or not h.results[covered])
        and cut.prefix == prefix_hash(h.digests, covered)
        and fits(h, cut.view, budget, budget.window - budget.recall)
    )


def _with_recap(
    history: History, loaded: Loaded, current: View, view: View, budget: Budget
) -> tuple[View, str]:
    """``view`` (which drops messages) with room for the recap of what it drops, and
    the recap: the same view when it fits beside it, else one that drops more for it;
    ``view`` and no recap when nothing to quote, or when even that would not fit."""
    h = history
    most = budget.quoted_values_max
    room = recap_chars(budget.summary_allowance - FRAME_TOKENS)
    start = current.covered
    recap = omitted_recap(
        h.messages[start : view.covered],
        h.digests[start : view.covered],
        loaded.summary,
        room,
        most,
    )
    if not recap:
        return view, ""
    extra = recap_tokens(recap) + QUOTED_FRAME_TOKENS
    fitted = replace(view, summary_tokens=view.summary_tokens + extra)
    if fits(h, fitted, budget, budget.target):
        return fitted, recap
    wider = trim_plan(h, current, budget, budget.target - extra)
    # A recap of the wider span, in the room the first one took or the wider view
    # leaves under the target if that is more.
    slack = budget.target - view_tokens(h, wider, budget)
    chars = min(room, max(len(recap), recap_chars(slack - QUOTED_FRAME_TOKENS)))
    dropped, digests = h.messages[start : wider.covered], h.digests[start : wider.covered]
    recap = omitted_recap(dropped, digests, loaded.summary, chars, most)
    extra = recap_tokens(recap) + QUOTED_FRAME_TOKENS if recap else 0
    fitted = replace(wider, summary_tokens=wider.summary_tokens + extra)
    if not fits(h, fitted, budget):
        return view, ""
    return fitted, recap


def _trimmed_summary(previous: str, dropped: int, recap: str) -> str:
    """The summary a trimmed view carries: the previous one's text, the marker, then the
    quoted sections (its restored values, the recap) for rebuild.py to keep together."""
    written, quoted = split_carried(previous)
    return "\n\n".join(part for part in (written, omitted_marker(dropped), quoted, recap) if part)


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


def trim_plan(history: History, current: View, budget: Budget, limit: int) -> View:
    """Deterministic fallback when summarisation fails: drop whole oldest groups.

    Elides first, as ``plan_compaction`` does; then drops groups from
    ``current.covered`` onward, oldest first and never the newest group, until the
    view is within ``limit``. The dropped span is represented by a one-line marker
    (``TRIM_MARKER_TOKENS``) after the existing summary, if any. When even the
    newest group alone exceeds ``limit`` the smallest possible view is returned.
    """
    check_view(history, current)
    totals = Totals.build(history, budget)
    results = history.results
    protected = protected_start(results, budget)
    view = replace(current, elide_before=max(current.elide_before, protected))
    if totals.tokens(view) <= limit:
        return view
    first = next_group_start(results, current.covered + 1)
    if first is None:
        return view
    carried = current.summary_tokens if current.covered > history.pinned else 0
    summary, elide_before = carried + TRIM_MARKER_TOKENS, view.elide_before
    cut = first_within(
        results, first, lambda cut: totals.tokens(View(cut, summary, elide_before)), limit
    )
    return View(cut, summary, elide_before)
