"""Cache-aware cuts end to end (issue 26 item 4): with ``compaction.cache_aware`` the
prefix the upstream caches is held until the trigger. The real proxy under uvicorn, the
openai SDK as client, the simulator as upstream (its prompt cache reports
``cached_tokens`` for a repeated prefix, OpenAI's rule); background pre-compaction on
(0.6 of the window). Each turn waits for the background run it started, so a snapshot
is always ready by the next turn: what the upstream sees then is the proxy's choice.

Without the rule the pre-compacted snapshot is served as soon as it lands, at 0.6 of the
window; with it, the view served last is held while it fits under the trigger (0.8) and
the cut then moves once, to ``target_ratio`` at most: fewer moves, each later, and between
two moves every request repeats the previous one byte for byte before its new turn, the
simulator answering it from its cache."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import httpx

from tests.support.chat import FILLER, WINDOW, Chat, chat_requests, small_window_settings
from tests.support.metrics import wait_for_idle

TURNS = 72
REPLY_PRIMING = 3  # the simulator's prompt count, beyond the messages it caches


def _play(url: str, sim: str, key: str) -> list[dict[str, Any]]:
    """The requests the simulator got for one conversation of ``TURNS`` turns."""
    httpx.delete(f"{sim}/_sim/requests")  # its prompt cache too: each run starts cold
    chat = Chat(url, key=key, session="cache-cuts")
    for turn in range(TURNS):
        chat.say(f"Turn {turn}: {FILLER}")
        wait_for_idle(url)
    return chat_requests(sim)


def _moves(requests: list[dict[str, Any]]) -> list[int]:
    """The requests whose messages do not start with the previous request's."""
    sent = [r["body"]["messages"] for r in requests]
    return [i + 1 for i, (a, b) in enumerate(pairwise(sent)) if b[: len(a)] != a]


def _prompt(request: dict[str, Any]) -> int:
    return int(request["usage"]["prompt_tokens"])


def _cached(request: dict[str, Any]) -> int:
    return int(request["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_cache_aware_cuts_hold_the_cached_prefix_until_the_trigger(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    runs = {}
    for aware in (False, True):
        settings = small_window_settings(sim_reset, precompact_ratio=0.6, cache_aware=aware)
        runs[aware] = _play(start_proxy(settings), sim_reset, f"sk-cache-{aware}")
    plain, held = runs[False], runs[True]
    assert len(plain) == len(held) == TURNS
    plain_moves, held_moves = _moves(plain), _moves(held)
    assert len(held_moves) >= 2, held_moves
    # Without the rule the cut moves when the background summary lands, around 0.6 of
    # the window; with it, only once the held view reaches the trigger (0.8).
    assert any(_prompt(plain[i - 1]) < 0.7 * WINDOW for i in plain_moves), plain_moves
    for i in held_moves:
        assert _prompt(held[i - 1]) > 0.7 * WINDOW, (i, _prompt(held[i - 1]))
        # ...to target_ratio at most (0.5; less when the summary is shorter than planned):
        # the next move many turns away.
        assert _prompt(held[i]) < 0.5 * WINDOW, (i, _prompt(held[i]))
    assert len(held_moves) < len(plain_moves), (held_moves, plain_moves)
    assert all(b - a >= 10 for a, b in pairwise(held_moves)), held_moves
    # Between moves, every request is the previous one and its new turn: the simulator
    # served that prefix (rounded down to its 128-token steps) from its cache.
    first = held_moves[0]
    for i in range(first + 1, TURNS):
        if i in held_moves:
            continue
        prefix = _prompt(held[i - 1]) - REPLY_PRIMING
        assert prefix - 128 < _cached(held[i]) <= prefix, (i, _cached(held[i]), prefix)
    # More of what is sent comes from the cache once it holds.
    hit = {aware: sum(map(_cached, r)) / sum(map(_prompt, r)) for aware, r in runs.items()}
    assert hit[True] > hit[False], hit
