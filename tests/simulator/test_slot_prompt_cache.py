"""The simulator's slots read prompts as llama.cpp's do (``prompt_tokens_per_s``; without
``--cache-reuse``): each slot keeps the prompt it read last, and a new prompt reuses only
their longest common prefix.
So a turn that extends the last prompt reads only what it added, while one whose history
was cut and given a new summary up front (a compaction's re-cut) reads it all again, as
do turns after another prompt (a summary) took the only slot: what the real-model bench
measured (bench/README.md, "Real model")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.support.servers import run_server

CONFIG = SimulatorConfig.model_validate({"slots": 1, "prompt_tokens_per_s": 1_000_000.0})
SYSTEM = {"role": "system", "content": "You are terse."}


def turns(n: int, start: int = 0) -> list[dict[str, Any]]:
    said: list[dict[str, Any]] = []
    for i in range(start, start + n):
        said.append({"role": "user", "content": f"question {i} " + "words " * 40})
        said.append({"role": "assistant", "content": f"answer {i} " + "words " * 40})
    return said


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with run_server(create_simulator_app(CONFIG)) as url:
        yield url


def read(base_url: str, messages: list[dict[str, Any]], purpose: str | None = None) -> int:
    """The prompt tokens the slot read, not from its cache, to answer ``messages``."""
    before = httpx.get(f"{base_url}/_sim/stats").json()["prompt_tokens_read"]
    headers = {"X-Compaction-Purpose": purpose} if purpose else {}
    body = {"model": "sim-small", "messages": messages}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    after = httpx.get(f"{base_url}/_sim/stats").json()["prompt_tokens_read"]
    assert 0 < after - before <= usage["prompt_tokens"]
    return int(after - before)


def test_a_turn_that_extends_the_last_prompt_reads_only_what_it_added(base_url: str) -> None:
    history = [SYSTEM, *turns(8)]
    first = read(base_url, [*history, {"role": "user", "content": "now?"}])
    grown = [*history, *turns(1, 8), {"role": "user", "content": "and now?"}]
    assert read(base_url, grown) < first / 4  # the new turn and question only


def test_a_new_summary_up_front_makes_the_slot_read_everything_after_it(base_url: str) -> None:
    history = [SYSTEM, *turns(8)]
    read(base_url, [*history, {"role": "user", "content": "now?"}])
    tail = turns(4, 4)  # the turns kept after a re-cut
    handoff = [
        {"role": "user", "content": "Summary of the earlier conversation: " + "facts " * 30},
        {"role": "assistant", "content": "Understood."},
    ]
    whole = [SYSTEM, *handoff, *tail, {"role": "user", "content": "now?"}]
    kept_alone = read(base_url, [SYSTEM, *tail, {"role": "user", "content": "now?"}])
    read(base_url, [*history, {"role": "user", "content": "now?"}])  # the slot as it was
    assert read(base_url, whole) > kept_alone  # the kept turns read again, and the handoff


def test_a_summary_in_the_only_slot_replaces_the_prompt_it_keeps(base_url: str) -> None:
    history = [SYSTEM, *turns(6), {"role": "user", "content": "now?"}]
    read(base_url, history)
    assert read(base_url, history) < 10  # the same prompt again: nothing but its end read
    read(base_url, [{"role": "user", "content": "summarize " + "x " * 200}], "summarize")
    assert read(base_url, history) > 200  # the summary took the slot's cache
