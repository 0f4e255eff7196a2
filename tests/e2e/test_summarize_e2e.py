"""Chunked summarization end to end: the real proxy against a simulator whose summarizer
model has a 1500-token window it enforces with real overflow errors, so a chunk that
does not fit fails loudly instead of passing unnoticed.

The transcript and the chunking in-process: tests/compaction/test_summarize.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.compaction.chunking import ChunkSize
from proxy.compaction.summarize import summarize
from proxy.compaction.summary_request import SummaryRequest
from proxy.config import Settings
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from proxy.types import ChatMessage
from proxy.upstream.client import UpstreamClient
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.encoders import ENCODER
from tests.support.metrics import exact_metric
from tests.support.servers import run_server

SUMMARIZER_WINDOW = 1500


def summarizer_calls(sim: str) -> list[dict[str, Any]]:
    recorded = httpx.get(f"{sim}/_sim/requests").json()
    return [r for r in recorded if r["headers"].get("x-compaction-purpose") == "summarize"]


def new_turns(call: dict[str, Any]) -> str:
    prompt = call["body"]["messages"][-1]["content"]
    match = re.search(r"<new_turns_(\w+)>\n(.*)\n</new_turns_\1>", prompt, re.S)
    assert match, "the summarizer prompt carries the turns to summarize"
    return match.group(2)


async def test_a_span_larger_than_a_chunk_is_folded_call_by_call(sim_reset: str) -> None:
    span: list[ChatMessage] = []
    for i in range(24):
        fact = f" FACT key{i}=value{i}" if i % 4 == 0 else ""
        span.append({"role": "user", "content": f"MSG{i:02d} {FILLER}{fact}"})
    client = UpstreamClient(Settings())
    try:
        request = SummaryRequest(
            client=client,
            api="chat",
            url=f"{sim_reset}/v1/chat/completions",
            headers=[(b"authorization", b"Bearer sk-test")],
            model="sim-summarizer",
            max_tokens=300,
            timeout_s=10,
            chunking=ChunkSize(1200),
        )
        summary = (await summarize(request, "FACT earlier=kept", span)).text
    finally:
        await client.aclose()

    calls = summarizer_calls(sim_reset)
    assert len(calls) > 1
    seen = [re.findall(r"MSG(\d\d)", new_turns(call)) for call in calls]
    # Every message is summarized exactly once, in order, and never split across calls.
    assert [int(n) for chunk in seen for n in chunk] == list(range(24))
    for call in calls:
        assert len(new_turns(call)) <= 1200
    # Each call updates the previous call's summary, so facts survive every fold.
    for i in range(0, 24, 4):
        assert f"FACT key{i}=value{i}" in summary
    assert "FACT earlier=kept" in summary
    assert "FACT earlier=kept" in calls[-1]["body"]["messages"][-1]["content"]


@pytest.fixture
def small_summarizer_sim() -> Iterator[str]:
    """A simulator whose summarizer model enforces a window of SUMMARIZER_WINDOW tokens."""
    config = SimulatorConfig(
        models=(
            ModelRule(match="sim-4k", context_window=WINDOW, max_output_tokens=256),
            ModelRule(match="sim-summarizer", context_window=SUMMARIZER_WINDOW),
        )
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def test_a_small_summarizer_window_chunks_one_compaction_into_several_calls(
    small_summarizer_sim: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        small_window_settings(
            small_summarizer_sim,
            summarizer_model="sim-summarizer",
            summarizer_context_window=SUMMARIZER_WINDOW,
        )
    )
    chat = Chat(url, session="chunked")
    calls_per_compaction: list[int] = []
    for turn in range(60):
        fact = f" FACT k{turn}=v{turn * 3}" if turn % 6 == 0 else ""
        before = stats(small_summarizer_sim)["summaries"]
        chat.say(f"Turn {turn}: {FILLER}{fact}")
        assert chat.last is not None
        if chat.last["x-compaction-status"] == "compacted":
            calls_per_compaction.append(stats(small_summarizer_sim)["summaries"] - before)

    sim = stats(small_summarizer_sim)
    assert sim["overflows"] == 0, "every chunk must fit the summarizer's window"
    assert chat.statuses["trimmed"] == 0
    assert chat.statuses["compacted"] >= 1
    assert len(calls_per_compaction) == chat.statuses["compacted"]
    assert sim["summaries"] > chat.statuses["compacted"]
    assert calls_per_compaction[0] >= 2, "the first compaction spans more than one chunk"
    for turn in range(0, 60, 6):
        assert chat.say(f"RECALL k{turn}") == f"k{turn}=v{turn * 3}"


@pytest.fixture
def short_output_sim() -> Iterator[str]:
    """A simulator whose chat model, like many real ones, caps replies at 256 tokens."""
    config = SimulatorConfig(
        models=(ModelRule(match="sim-4k", context_window=WINDOW, max_output_tokens=256),)
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def _long_chat(url: str, session: str) -> Chat:
    """A chat whose history is past the trigger, so its next turn compacts."""
    chat = Chat(url, session=session)
    for turn in range(21):
        chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        chat.history.append({"role": "assistant", "content": f"Noted. {FILLER}"})
    return chat


def test_a_summarizer_that_writes_less_is_asked_again_within_its_stated_limit(
    short_output_sim: str, start_proxy: Callable[..., str]
) -> None:
    """summary_max_tokens is 400; this model refuses more than 256 with its output-budget
    error. The chat model's reply reserve is not the summary's budget, so the proxy asks
    for 400 and, refused, once more for the 256 the error states."""
    chat = _long_chat(start_proxy(small_window_settings(short_output_sim)), "capped")
    chat.say("FACT cap=ok and carry on")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    asked = [call["body"]["max_tokens"] for call in summarizer_calls(short_output_sim)]
    assert asked[:2] == [400, 256]


def test_a_configured_summarizer_output_limit_is_asked_for_directly(
    short_output_sim: str, start_proxy: Callable[..., str]
) -> None:
    settings = small_window_settings(short_output_sim, summarizer_max_output_tokens=256)
    chat = _long_chat(start_proxy(settings), "configured")
    chat.say("carry on")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    asked = {call["body"]["max_tokens"] for call in summarizer_calls(short_output_sim)}
    assert asked == {256}


def test_a_4k_windows_first_compaction_takes_at_most_two_summarizer_calls(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Issue 24: chunks sized in characters at 3 a token filled about two thirds of a
    call, so a 4k window's first compaction of a ~3.5k-token span made three sequential
    summarizer calls (seconds to tens of seconds each with a real model). Each call now
    takes what the summarizer's window leaves room for, and none overflows it."""
    url = start_proxy(small_window_settings(sim_reset, summary_max_tokens=2000))
    chat = Chat(url, session="two-calls")
    for turn in range(27):  # ~5k tokens: more than the window, as a client may send
        chat.history.append(
            {"role": "user", "content": f"Turn {turn}: {FILLER} FACT k{turn}=v{turn * 7}"}
        )
        chat.history.append({"role": "assistant", "content": f"Noted turn {turn}. {FILLER}"})
    chat.say("and carry on")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    calls = summarizer_calls(sim_reset)
    span = sum(ENCODER.count(new_turns(call)) for call in calls)
    assert span >= 3300, "the first compaction folds a ~3.5k-token span"
    assert len(calls) <= 2
    # Reported: the calls of each new summary, chunks and retries included.
    histogram = "compaction_proxy_summarizer_calls_per_compaction"
    assert exact_metric(url, f"{histogram}_count") == 1
    assert exact_metric(url, f"{histogram}_sum") == len(calls)
    assert stats(sim_reset)["overflows"] == 0, "every call fits the summarizer's window"
    for turn in (0, 12, 20):
        assert chat.say(f"RECALL k{turn}") == f"k{turn}=v{turn * 7}"
