"""The simulator as a slow, single-slot server: ``tokens_per_s`` makes a reply of N
output tokens take N / tokens_per_s seconds in its slot, a summary as well as a turn, so
a turn sent meanwhile queues behind it as on llama.cpp ``-np 1`` on a loaded CPU."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.support.servers import run_server

SPEED = 200.0  # output tokens a second
CONFIG = SimulatorConfig.model_validate(
    {"slots": 1, "tokens_per_s": SPEED, "reply_tokens": 24, "summary_latency_ms": 0}
)
HELLO: Any = [{"role": "user", "content": "hello"}]
SUMMARIZE = {"X-Compaction-Purpose": "summarize"}


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with run_server(create_simulator_app(CONFIG)) as url:
        yield url


@pytest.fixture(scope="module")
def sdk(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0) as client:
        yield client


def _timed(sdk: openai.OpenAI, **extra: Any) -> tuple[float, int]:
    """Seconds one chat completion took, and the output tokens it wrote."""
    started = time.monotonic()
    reply = sdk.chat.completions.create(model="sim-small", messages=HELLO, **extra)
    assert reply.usage is not None
    return time.monotonic() - started, reply.usage.completion_tokens


def test_a_reply_takes_its_output_tokens_over_the_speed(sdk: openai.OpenAI) -> None:
    took, tokens = _timed(sdk)
    assert tokens > 0
    assert took >= tokens / SPEED  # never sooner than writing it takes
    took, tokens = _timed(sdk, max_tokens=4)  # fewer tokens written: sooner
    assert took >= tokens / SPEED


def test_a_stream_waits_for_the_writing_before_its_first_byte(sdk: openai.OpenAI) -> None:
    started = time.monotonic()
    stream = sdk.chat.completions.create(model="sim-small", messages=HELLO, stream=True)
    next(iter(stream))
    first = time.monotonic() - started
    stream.close()
    assert first >= 20 / SPEED  # the reply is about reply_tokens (24) long


def test_a_turn_queues_behind_a_slow_summary_in_the_only_slot(
    base_url: str, sdk: openai.OpenAI
) -> None:
    """A long summary holds the one slot while it is written; a turn sent meanwhile waits."""
    summary_s: list[float] = []

    def summarize() -> None:
        started = time.monotonic()
        body = {"model": "sim-small", "messages": HELLO, "max_tokens": 400}
        with httpx.Client(timeout=30) as http:
            answer = http.post(f"{base_url}/v1/chat/completions", json=body, headers=SUMMARIZE)
        assert answer.status_code == 200
        summary_s.append(time.monotonic() - started)

    waits = httpx.get(f"{base_url}/_sim/stats").json()["slot_waits"]
    worker = threading.Thread(target=summarize)
    worker.start()
    while httpx.get(f"{base_url}/_sim/stats").json()["summaries"] == 0:  # it holds the slot
        time.sleep(0.01)
    took, _ = _timed(sdk)
    worker.join(30)
    assert httpx.get(f"{base_url}/_sim/stats").json()["slot_waits"] == waits + 1
    assert summary_s, "the summary did not answer"
    assert took > 24 / SPEED  # its own writing, after the summary's
