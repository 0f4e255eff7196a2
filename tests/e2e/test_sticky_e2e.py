"""Sticky trim cuts end to end (issue 21): a session whose summaries keep failing is
served trimmed turn after turn; the upstream must see the same prefix from one turn to
the next, as a prefix cache needs (llama.cpp's prompt cache missed on every turn when
the cut moved: ~1,900 tokens processed again a turn), re-trimming only every few turns.
The real proxy under uvicorn, the openai SDK as client, the simulator as upstream with
a summarizer model whose window no summary fits; assertions read what it received."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

from tests.support.chat import (
    FILLER,
    Chat,
    broken_summarizer,  # noqa: F401 (a fixture)
    chat_requests,
    small_window_settings,
    without_excerpts,
)


def _is_prefix(before: list[Any], after: list[Any]) -> bool:
    return after[: len(before)] == before


def test_turns_served_trimmed_keep_the_prefix_the_upstream_saw(
    broken_summarizer: str,  # noqa: F811 (the fixture imported above)
    start_proxy: Callable[..., str],
) -> None:
    sim = broken_summarizer
    url = start_proxy(small_window_settings(sim, summarizer_model="broken"))
    chat = Chat(url, key="sk-sticky", session="sticky")
    turn = 0
    while chat.statuses["trimmed"] == 0:
        chat.say(f"Turn {turn}: {FILLER}")
        turn += 1
        assert turn < 60
    first = len(chat_requests(sim)) - 1  # the first trimmed turn's request
    for more in range(12):  # within the back-off (30 s): trimmed without a summary call
        chat.say(f"More {more}: {FILLER * 3}")
        assert chat.last is not None
        assert chat.last["x-compaction-status"] == "trimmed"
    # Recall's excerpts come before the newest user message (and move on to the next one
    # that has its own), after the cut: the prefix the cut keeps is what is compared.
    sent = [without_excerpts(r["body"]["messages"]) for r in chat_requests(sim)[first:]]
    assert len(sent) == 13
    kept = [_is_prefix(a, b) for a, b in pairwise(sent)]
    retrims = [i for i, same in enumerate(kept) if not same]
    # Each turn adds ~300 tokens; a re-trim drops to the target (half the window), so
    # the cut holds for several turns, then moves once.
    assert 1 <= len(retrims) <= 3, kept
    assert all(b - a >= 3 for a, b in pairwise(retrims)), kept
