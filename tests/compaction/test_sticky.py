"""Sticky trim cuts (trim.trimmed, sticky.py): a session served trimmed turn after turn
keeps its cut while the view fits the window, so the upstream sees the same prefix,
byte for byte, and its prefix cache hits; once the view no longer fits it trims to
the target again. Pure values here; tests/e2e/test_sticky_e2e.py runs it over HTTP."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from proxy.core import omitted
from proxy.core.budget import Budget
from proxy.core.digest import digests_and_sizes
from proxy.core.history import History, result_flags
from proxy.core.outcome import Outcome
from proxy.core.snapshot import Loaded
from proxy.core.trim import Cut, trimmed
from proxy.core.wording import OMITTED_HEADING
from proxy.types import ChatMessage

# 100 tokens a message: each turn (a reply and the next question) adds 200. The view
# re-trims to 1400 once it passes 2000, so a cut holds for two or three turns.
BUDGET = Budget(window=2000, reserve=20, fixed=0, trigger=1800, target=1400, summary_allowance=200)


def conversation(questions: int) -> History:
    """The system prompt, then ``questions`` user turns with the replies between."""
    messages: list[ChatMessage] = [{"role": "system", "content": "You are helpful."}]
    for i in range(questions):
        if i:
            messages.append({"role": "assistant", "content": f"Noted, reply {i}."})
        messages.append({"role": "user", "content": f"Turn {i}: the port is {8000 + i} now."})
    digests, _ = digests_and_sizes(messages)
    counts = [10] + [100] * (len(messages) - 1)
    return History(messages, digests, counts, 1, 0, result_flags(messages))


def trim(history: History, previous: Cut | None) -> tuple[Outcome, Cut]:
    outcome, cut = trimmed(history, Loaded(None, None), BUDGET, "user", previous)
    assert outcome.status == "trimmed"
    assert cut is not None
    return outcome, cut


def sent(outcome: Outcome) -> list[ChatMessage]:
    assert outcome.messages is not None
    return outcome.messages


def test_a_cut_that_still_fits_is_kept_and_the_prefix_is_byte_identical() -> None:
    first, cut = trim(conversation(12), None)
    assert first.tokens + BUDGET.reserve <= BUDGET.target
    assert OMITTED_HEADING in str(sent(first)[1]["content"])  # a digest to keep, too
    omitted._held.clear()  # the digest is kept as served, not read again
    second, again = trim(conversation(13), cut)
    assert again == cut
    assert sent(second)[: len(sent(first))] == sent(first)
    assert second.tokens + BUDGET.reserve <= BUDGET.window


def test_without_the_previous_cut_each_turn_trims_anew() -> None:
    """What the sticky cut fixes: trimmed from scratch, the cut moves every turn."""
    first, cut = trim(conversation(12), None)
    second, moved = trim(conversation(13), None)
    assert moved.view.covered > cut.view.covered
    assert sent(second)[: len(sent(first))] != sent(first)


def test_a_cut_that_no_longer_fits_trims_to_the_target_again_and_then_holds() -> None:
    _, cut = trim(conversation(12), None)
    covered = [cut.view.covered]
    for questions in range(13, 24):
        outcome, cut = trim(conversation(questions), cut)
        assert outcome.tokens + BUDGET.reserve <= BUDGET.window
        if cut.view.covered != covered[-1]:  # a re-trim: down to the target
            assert outcome.tokens + BUDGET.reserve <= BUDGET.target
        covered.append(cut.view.covered)
    retrims = sum(1 for a, b in pairwise(covered) if a != b)
    assert 1 <= retrims <= len(covered) // 2


def test_a_cut_is_not_reused_for_another_history_or_another_snapshot() -> None:
    _, cut = trim(conversation(12), None)
    edited = conversation(13)
    messages = list(edited.messages)
    messages[2] = {"role": "assistant", "content": "A different reply."}
    digests, _ = digests_and_sizes(messages)
    edited = replace(edited, messages=messages, digests=digests)
    _, fresh = trim(edited, cut)
    assert fresh != cut  # its dropped span is not the one the digest quotes
    _, fresh = trim(conversation(13), replace(cut, version=3))
    assert fresh.view != cut.view
    _, fresh = trim(conversation(13), replace(cut, start=2))
    assert fresh.view != cut.view


def test_nothing_to_trim_remembers_no_cut() -> None:
    _, cut = trim(conversation(12), None)
    outcome, kept = trimmed(conversation(3), Loaded(None, None), BUDGET, "user", cut)
    assert outcome.status != "trimmed"
    assert kept is None


def test_a_kept_cut_serves_its_digest_as_served_even_over_a_long_span() -> None:
    """The digest of a span longer than omitted.DIGEST_SCANNED is read over several
    calls (newest first, the rest on later ones), so reading it again could give other
    bytes: a kept cut serves the digest's text as it was served."""
    filler = "and then we talked about nothing in particular for a while " * 180
    history = conversation(12)
    messages = [
        {**m, "content": f"{m['content']} {filler}"} if 1 < i < 22 else m
        for i, m in enumerate(history.messages)
    ]
    assert sum(len(str(m["content"])) for m in messages[1:13]) > omitted.DIGEST_SCANNED
    digests, _ = digests_and_sizes(messages)
    history = replace(history, messages=messages, digests=digests)
    omitted._held.clear()
    first, cut = trim(history, None)
    grown = conversation(13)
    grown = replace(grown, messages=[*messages, grown.messages[-2], grown.messages[-1]])
    digests, _ = digests_and_sizes(grown.messages)
    second, again = trim(replace(grown, digests=digests), cut)
    assert again == cut
    assert sent(second)[: len(sent(first))] == sent(first)
