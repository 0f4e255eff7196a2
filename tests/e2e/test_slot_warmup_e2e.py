"""A single-slot server whose slot reads prompts as llama.cpp's does (the simulator's
``prompt_tokens_per_s``: it keeps the prompt it read last and reuses only their common
prefix): the first turn served a new background snapshot does not read its view cold,
because the proxy read it into the slot once the summary was saved (compaction/warm.py),
while no turn waited.

End to end: the real proxy under uvicorn, the OpenAI SDK as the client, the simulator as
the upstream with one slot. Between turns the client waits for the proxy's background
work to end, as a person reading the answer would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.config import ModelSpec
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.metrics import metric
from tests.support.servers import run_server

pytestmark = pytest.mark.e2e

TURNS = 24


@pytest.fixture(scope="module")
def reading_slot() -> Iterator[str]:
    config = SimulatorConfig(
        slots=1,
        prompt_tokens_per_s=50_000.0,  # a 3k-token view: 60 ms, cold
        reply_tokens=2,
        models=(ModelRule(match="sim-4k", context_window=WINDOW),),
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def _settings(sim: str) -> Any:
    settings = small_window_settings(
        sim, precompact_ratio=0.6, precompact_idle_s=0.05, summary_timeout_s=30
    )
    model = ModelSpec(match="sim-4k", context_window=WINDOW, max_output_tokens=256, slots=1)
    return settings.model_copy(update={"models": [model]})


def _idle(url: str) -> None:
    """Until the proxy runs no background work (bounded: 20 s)."""
    deadline = time.monotonic() + 20
    while metric(url, "compaction_proxy_precompactions_running") > 0:
        assert time.monotonic() < deadline, "a background compaction never ended"
        time.sleep(0.02)


def test_the_first_turn_on_a_new_snapshot_finds_its_view_in_the_slot(
    reading_slot: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(_settings(reading_slot))
    chat = Chat(url, key="sk-warm", session="warm-1")
    first_on_snapshot: list[tuple[int, int]] = []  # (tokens read cold, prompt tokens)
    version = "0"
    for number in range(TURNS):
        before = stats(reading_slot)["prompt_tokens_read"]
        chat.say(f"Turn {number}: {FILLER * 3}")
        read = stats(reading_slot)["prompt_tokens_read"] - before
        assert chat.last is not None
        now = chat.last.get("x-compaction-version", "0")
        if now != version and chat.last["x-compaction-status"] == "snapshot":
            first_on_snapshot.append((read, int(chat.last["x-context-tokens"])))
        version = now
        _idle(url)
    assert metric(url, "compaction_proxy_precompactions", outcome="compacted") >= 2
    assert metric(url, "compaction_proxy_slot_warmups", outcome="warmed") >= 2
    assert len(first_on_snapshot) >= 2, first_on_snapshot
    for read, tokens in first_on_snapshot:
        # The previous answer and the new question only, not the view (about 2.5k tokens).
        assert read < tokens / 4, first_on_snapshot
