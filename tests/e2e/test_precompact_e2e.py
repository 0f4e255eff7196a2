"""Background pre-compaction (issue 11), end to end: the real proxy under uvicorn, the
openai SDK as client, the project's simulator as upstream, its summaries slowed far
beyond a chat answer so that any turn that waits on a summary shows in its latency.

The decisions in-process: tests/compaction/test_precompact.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
import redis

from proxy.config import Settings
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.metrics import metric, wait_for_idle
from tests.support.precompaction import (
    over_soft_threshold,
)
from tests.support.servers import RedisServer, run_proxy, run_server

CHAT_MS = 250


SUMMARY_MS = 1000


@pytest.fixture
def slow_summaries() -> Iterator[str]:
    """A simulator answering chats in CHAT_MS and summaries in SUMMARY_MS."""
    config = SimulatorConfig(
        latency_ms=CHAT_MS,
        summary_latency_ms=SUMMARY_MS,
        models=(ModelRule(match="sim-4k", context_window=WINDOW),),
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def test_no_turn_waits_on_a_summary_once_the_session_passes_the_soft_threshold(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(slow_summaries, precompact_ratio=0.6))
    chat = Chat(url, session="agent-run")
    # Up to just under the soft threshold, at full speed: nothing compacts yet.
    chat.headers["X-Sim-Latency-Ms"] = "0"
    chat.say("Remember this. FACT launch=ok-7731")
    turn = 0
    while int(chat.last["x-context-tokens"]) < WINDOW * 0.5:  # type: ignore[index]
        chat.say(f"Turn {turn}: {FILLER}")
        turn += 1
        assert turn < 60
    del chat.headers["X-Sim-Latency-Ms"]

    versions = []
    for _ in range(30):
        chat.say(f"Turn {turn}: {FILLER}")
        assert chat.last is not None
        versions.append(int(chat.last["x-compaction-version"]))
        turn += 1
    assert chat.say("RECALL launch") == "launch=ok-7731"
    wait_for_idle(url)
    waits = metric(url, "compaction_proxy_inline_summary_waits")
    background = metric(url, "compaction_proxy_compactions_by_trigger", trigger="background")
    # No turn waited on a summary (each that does is counted: no clock needed).
    assert waits == 0, f"{waits} turns waited on a summary"
    assert background >= 2
    assert metric(url, "compaction_proxy_compactions_by_trigger", trigger="inline") == 0
    # Every compaction was used by the next turns: versions only move forward, and
    # the turns after one are served from its snapshot.
    assert versions == sorted(versions)
    assert len(set(versions) - {0}) >= 2
    assert chat.statuses["compacted"] == 0
    assert chat.statuses["snapshot"] >= 20
    sim = stats(slow_summaries)
    assert sim["overflows"] == 0
    assert sim["summaries"] == background


async def _send(url: str, session: str, **headers: str) -> httpx.Headers:
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="sk-cap", max_retries=0, timeout=30
    ) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-4k",
            messages=over_soft_threshold(session),  # type: ignore[arg-type]
            stream=True,
            extra_headers={"X-Session-Id": session, "X-Sim-Latency-Ms": "0", **headers},
        )
        async for _ in raw.parse():  # to the end of the stream
            pass
        return raw.headers


async def test_background_summaries_respect_the_cap_across_sessions(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        small_window_settings(slow_summaries, precompact_ratio=0.6, precompact_concurrency=2)
    )
    results = await asyncio.gather(*(_send(url, f"cap-{i}") for i in range(5)))
    tokens = [int(h["x-context-tokens"]) for h in results]
    assert all(WINDOW * 0.6 < t + 256 < WINDOW * 0.8 for t in tokens), tokens
    assert {h["x-compaction-status"] for h in results} == {"passthrough"}
    await asyncio.to_thread(wait_for_idle, url)
    assert metric(url, "compaction_proxy_precompactions", outcome="compacted") == 2
    assert metric(url, "compaction_proxy_precompactions", outcome="skipped_cap") == 3
    assert stats(slow_summaries)["summaries"] == 2


async def test_bypassed_requests_are_never_precompacted(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(slow_summaries, precompact_ratio=0.6))
    headers = await _send(url, "bypass", **{"X-Compaction": "off"})
    assert headers["x-compaction-status"] == "bypassed"
    await asyncio.sleep(0.3)
    assert metric(url, "compaction_proxy_precompactions") == 0
    assert stats(slow_summaries)["requests"] == 1


@pytest.mark.redis
def test_shutdown_cancels_a_running_background_summary_and_releases_its_lock(
    redis_server: RedisServer, slow_summaries: str
) -> None:
    settings = small_window_settings(slow_summaries, precompact_ratio=0.6).model_copy(
        update={"store": Settings(store={"url": redis_server.url}).store}
    )
    locks = redis.Redis.from_url(redis_server.url)
    try:
        with run_proxy(settings) as url:
            asyncio.run(_send(url, "shutdown"))
            deadline = time.monotonic() + 60
            while not locks.keys("cp:lock:*"):
                assert time.monotonic() < deadline, "no background summary started"
                time.sleep(0.02)
        # Shutdown did not wait for the summary: its call was cancelled (the simulator saw
        # its caller leave) and the lock released.
        assert locks.keys("cp:lock:*") == []
        sim = stats(slow_summaries)
        assert sim["calls_abandoned"] == 1  # the summary call itself was cancelled
    finally:
        locks.close()
