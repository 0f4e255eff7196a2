"""Clients that re-send or move messages (issue 37 item 4), end to end: the real proxy
under uvicorn, the openai SDK as client, the simulator as upstream with slow summaries.

- aider re-sends its chat files as a fixed exchange (a user message and the "Ok"
  after it) placed after the conversation so far, so each turn it sits one exchange
  further on, before the newest message;
- an agent sends, after each answer, a side request with another system prompt
  (memory extraction, a title) over the same history, under the same session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.metrics import metric, wait_for_idle
from tests.support.servers import run_server

TURNS = 30
FILES = "Here are the files you may edit:\nsrc/app.py\n```\n" + "x = 1\n" * 300 + "```"


@pytest.fixture
def slow_summaries() -> Iterator[str]:
    config = SimulatorConfig(
        latency_ms=50,
        summary_latency_ms=400,
        models=(ModelRule(match="sim-4k", context_window=WINDOW),),
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def _aider_turn(chat: Chat, done: list[dict[str, Any]], text: str) -> str:
    """One turn as aider sends it: system, the conversation so far, the chat files as
    a fixed exchange, then the newest message; the answer joins the conversation."""
    newest = {"role": "user", "content": text}
    files = [{"role": "user", "content": FILES}, {"role": "assistant", "content": "Ok."}]
    chat.history = [{"role": "system", "content": "Act as an expert developer."}]
    chat.history += [*done, *files, newest]
    message = chat.send()
    done += [newest, {"role": "assistant", "content": message.content}]
    return str(message.content)


def test_a_fixed_exchange_moved_each_turn_keeps_background_snapshots(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(slow_summaries, precompact_ratio=0.6))
    chat = Chat(url, session="aider-run")
    done: list[dict[str, Any]] = []
    _aider_turn(chat, done, "Remember this. FACT launch=ok-7731")
    for turn in range(TURNS):
        _aider_turn(chat, done, f"Turn {turn}: {FILLER}")
        # The exchange moved on, and the snapshot still applies: served, not re-made.
        assert chat.last["x-compaction-status"] in ("passthrough", "snapshot")
    wait_for_idle(url)
    inline = metric(url, "compaction_proxy_inline_summary_waits", kind="summarized")
    summaries = stats(slow_summaries)["summaries"]
    assert inline == 0, f"{inline} turns summarized in their own path"
    # Each background summary extends the last by the turns since (about 100 tokens
    # each, 600 of room under the 4k window once the files are in the tail): one per
    # five turns at most, where a snapshot the moved exchange broke re-made one a turn.
    assert summaries <= 1 + TURNS // 5, f"{summaries} summaries in {TURNS} turns"
    assert _aider_turn(chat, done, "RECALL launch") == "launch=ok-7731"


def _side(chat: Chat, side: Chat) -> Any:
    """The side request an agent sends after an answer: its own system prompt over the
    conversation so far, and its own instruction, under the same session."""
    ask = {"role": "user", "content": "Extract the facts worth remembering."}
    side.history = [{"role": "system", "content": "You extract memories."}, *chat.history[1:]]
    side.history.append(ask)
    return side.send()


def test_side_requests_over_the_same_history_summarize_nothing_of_their_own(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(slow_summaries, precompact_ratio=0.6))
    chat, side = Chat(url, session="agent-run"), Chat(url, session="agent-run")
    chat.say("Remember this. FACT launch=ok-7731")
    shown: set[int] = set()
    for turn in range(36):  # two background summaries of the conversation's
        chat.say(f"Turn {turn}: {FILLER}")
        shown.add(int(chat.last["x-compaction-version"]))
        _side(chat, side)
        # Shown under the conversation's snapshot (or none yet), never one of its own.
        assert side.last["x-compaction-status"] in ("passthrough", "snapshot")
        assert int(side.last["x-compaction-version"]) in {*shown, max(shown) + 1}
    wait_for_idle(url)
    assert chat.say("RECALL launch") == "launch=ok-7731"
    version = int(chat.last["x-compaction-version"])
    # Every summary is one of the conversation's snapshots, each extending the last.
    assert version >= 2
    assert stats(slow_summaries)["summaries"] == version
    assert metric(url, "compaction_proxy_session_slot_misses", outcome="side") > 0
