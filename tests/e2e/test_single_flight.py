"""One summarization per session at a time, and logs that never carry secrets.

End to end: the real proxy under uvicorn, the openai SDK as client, and the
project's simulator as upstream. The single-flight simulator answers every
call (summaries included) after 300 ms, so concurrent requests for one
session are certain to overlap a running summarization.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import openai
import pytest

from proxy.observe.logs import TextFormatter
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.servers import run_server

CONCURRENT = 10
LATENCY_MS = 300


@pytest.fixture
def slow_sim() -> Iterator[str]:
    """A simulator that takes LATENCY_MS over every answer, summaries included."""
    config = SimulatorConfig(
        latency_ms=LATENCY_MS,
        models=(ModelRule(match="sim-4k", context_window=WINDOW),),
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def over_threshold_history() -> list[dict[str, Any]]:
    """A conversation past the 80% trigger of the 4k window, built without the proxy."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(22):
        history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        history.append({"role": "assistant", "content": f"Noted turn {turn}. {FILLER}"})
    history.append({"role": "user", "content": "FACT burst=ok What did we cover? RECALL burst"})
    return history


async def send_burst(
    base: str, session: str, history: list[Any], n: int
) -> list[tuple[Mapping[str, str], str | None]]:
    async with openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key="sk-burst", max_retries=0, timeout=30
    ) as client:

        async def one() -> tuple[Mapping[str, str], str | None]:
            raw = await client.chat.completions.with_raw_response.create(
                model="sim-4k", messages=history, extra_headers={"X-Session-Id": session}
            )
            return raw.headers, raw.parse().choices[0].message.content

        return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_concurrent_requests_for_one_session_summarize_once(
    slow_sim: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(slow_sim))
    history = over_threshold_history()

    # Baseline: how many summarizer calls one compaction of this history takes.
    ((headers, _),) = await send_burst(url, "baseline", history, 1)
    assert headers["x-compaction-status"] == "compacted"
    per_compaction = stats(slow_sim)["summaries"]
    assert per_compaction >= 1

    results = await send_burst(url, "burst", history, CONCURRENT)
    assert stats(slow_sim)["summaries"] - per_compaction == per_compaction, (
        "concurrent requests for one session must share a single summarization"
    )
    statuses = Counter(h["x-compaction-status"] for h, _ in results)
    assert statuses == {"compacted": 1, "snapshot": CONCURRENT - 1}
    assert {h["x-compaction-version"] for h, _ in results} == {"1"}
    assert all(content == "burst=ok" for _, content in results)
    sim = stats(slow_sim)
    assert sim["overflows"] == 0
    assert sim["failures"] == 0


async def test_requests_for_different_sessions_do_not_wait_for_each_other(
    slow_sim: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(slow_sim))
    history = over_threshold_history()
    per_session = await asyncio.gather(
        *(send_burst(url, f"independent-{i}", history, 1) for i in range(4))
    )
    assert [r[0][0]["x-compaction-status"] for r in per_session] == ["compacted"] * 4


SECRET = "zebra-quartz-7731-launch-code"
API_KEY = "sk-live-DoNotLogMe-93f1c2ab"
SESSION_ID = "customer-4411-private-thread"


def log_text(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the servers logged: messages with their fields, raw arguments and tracebacks.

    Records from this thread are the test's own HTTP clients, not the proxy's.
    """
    formatter = TextFormatter()  # as the proxy writes text lines: fields as key=value
    out = []
    for record in caplog.records:
        if record.thread == threading.get_ident():
            continue
        out.append(formatter.format(record))
        out.append(repr(record.args))
    return out


def run_conversation_through_compaction(base: str) -> Chat:
    chat = Chat(base, key=API_KEY, session=SESSION_ID)
    chat.say(f"Remember this. FACT vault={SECRET}")
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}")
    return chat


def test_compaction_is_logged_without_secrets(
    sim_reset: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = start_proxy(small_window_settings(sim_reset))
    chat = run_conversation_through_compaction(url)
    assert chat.statuses["compacted"] >= 1
    assert chat.say("RECALL vault") == f"vault={SECRET}"
    info = httpx.get(f"{url}/sessions/{SESSION_ID}", headers={"Authorization": f"Bearer {API_KEY}"})
    assert SECRET in info.json()["summary"], "the secret went through summarization"

    lines = log_text(caplog)
    compactions = [
        line for line in lines if "compaction session=" in line and "outcome=compacted" in line
    ]
    assert len(compactions) == chat.statuses["compacted"]
    for line in lines:
        assert SECRET not in line
        assert API_KEY not in line
        assert API_KEY[-8:] not in line
        assert SESSION_ID not in line


@pytest.fixture
def broken_summarizer_sim() -> Iterator[str]:
    """A simulator whose summarizer model can never fit a summarization prompt."""
    config = SimulatorConfig(models=(ModelRule(match="tiny-summarizer", context_window=200),))
    with run_server(create_simulator_app(config)) as url:
        yield url


def test_failed_summarization_is_logged_without_secrets(
    broken_summarizer_sim: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = start_proxy(
        small_window_settings(broken_summarizer_sim, summarizer_model="tiny-summarizer")
    )
    chat = run_conversation_through_compaction(url)
    assert chat.statuses["trimmed"] >= 1

    lines = log_text(caplog)
    failures = [r for r in caplog.records if r.levelno == logging.WARNING and "summar" in r.msg]
    assert failures, "a failed summarization is logged as a warning"
    assert any("outcome=trimmed" in line for line in lines)
    for line in lines:
        assert SECRET not in line
        assert API_KEY not in line
        assert SESSION_ID not in line
