"""Background pre-compaction (issue 11): the decisions in-process, then end to end.

End to end: the real proxy under uvicorn, the openai SDK as client, the project's
simulator as upstream, its summaries slowed far beyond a chat answer so that any
turn that waits on a summary shows in its latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
import redis

from proxy.compaction.precompact import Precompactor, background_budget, wants_precompaction
from proxy.compaction.snapshots import Loaded, next_snapshot, view_of
from proxy.config import CompactionSettings, Settings, load_settings
from proxy.core.budget import Budget
from proxy.core.plan import plan_compaction
from proxy.errors import ConfigError
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.metrics import metric, wait_for_idle
from tests.support.precompaction import (
    _conversation,
    _job,
    _outcomes,
    _services,
    over_soft_threshold,
)
from tests.support.servers import RedisServer, run_proxy, run_server

CHAT_MS = 250
SUMMARY_MS = 1000

# In-process: the decisions.


@pytest.mark.parametrize(
    ("tokens", "ratio", "wanted"),
    [
        (2457, 0.6, False),  # at the threshold: not past it
        (2458, 0.6, True),
        (4000, 0.6, True),
        (100, 0.01, True),
        (4000, None, False),  # off
        (4000, 0.0, False),  # off
    ],
)
def test_precompaction_is_wanted_only_past_the_soft_threshold(
    tokens: int, ratio: float | None, wanted: bool
) -> None:
    settings = CompactionSettings(precompact_ratio=ratio)
    assert wants_precompaction(tokens, 4096, settings) is wanted


def test_background_plans_compact_earlier_and_deeper_in_the_same_proportions() -> None:
    settings = CompactionSettings(trigger_ratio=0.8, target_ratio=0.5, precompact_ratio=0.6)
    budget = Budget(
        window=10_000, reserve=256, fixed=0, trigger=8000, target=5000, summary_allowance=460
    )
    early = background_budget(budget, settings)
    assert (early.trigger, early.target) == (6000, 3750)
    assert early.target / early.trigger == pytest.approx(budget.target / budget.trigger)
    assert (early.window, early.reserve, early.summary_allowance) == (10_000, 256, 460)


@pytest.mark.parametrize("ratio", [0.8, 0.9])
def test_precompact_ratio_must_be_below_the_trigger(ratio: float) -> None:
    with pytest.raises(ConfigError, match="precompact_ratio must be below trigger_ratio"):
        load_settings(compaction={"precompact_ratio": ratio})


def test_precompaction_can_be_switched_off() -> None:
    assert Settings(compaction={"precompact_ratio": None}).compaction.precompact_ratio is None
    assert Settings(compaction={"precompact_ratio": 0}).compaction.precompact_ratio == 0


async def test_more_sessions_than_the_cap_are_skipped_and_counted() -> None:
    services = await _services(precompact_concurrency=2)
    try:
        pre = services.precompactor
        jobs = [await _job(services, f"s{i}", _conversation(2)) for i in range(3)]
        for job in jobs:
            await pre.start(job)  # returns at once: the tasks have not run yet
        assert set(pre.running) == {jobs[0].key, jobs[1].key}
        assert _outcomes(services) == {"skipped_cap": 1}
        await pre.start(jobs[0])
        assert _outcomes(services) == {"skipped_cap": 1, "skipped_running": 1}
        await asyncio.gather(*pre.running.values())
        assert _outcomes(services)["covered"] == 2  # far below the threshold: nothing to do
        assert not pre.running
    finally:
        await services.aclose()


async def test_a_session_with_nothing_to_fold_in_backs_off_until_the_retry_interval() -> None:
    services = await _services(precompact_retry_s=30)
    now = [1000.0]
    try:
        pre = Precompactor(
            services.settings.compaction, services.compactor, services.metrics, lambda: now[0]
        )
        # Past the soft threshold, but all of it in the newest message, never compacted.
        job = await _job(services, "one-big-ask", _conversation(0, FILLER * 40))
        assert wants_precompaction(sum(job.history.counts) + 256, WINDOW, pre.settings)
        await pre.start(job)
        await asyncio.gather(*pre.running.values())
        assert _outcomes(services) == {"unchanged": 1}
        assert pre.skip_reason(job.key) == "skipped_backoff"
        now[0] += 29
        assert pre.skip_reason(job.key) == "skipped_backoff"
        now[0] += 2
        assert pre.skip_reason(job.key) is None
    finally:
        await services.aclose()


async def test_a_turn_offered_before_the_last_compaction_finds_it_covered_without_backoff() -> None:
    """Turns keep offering while a background summary runs; once it has landed, their
    runs find the session compacted: no second summary, and no back-off either."""
    services = await _services()
    try:
        pre = services.precompactor
        job = await _job(services, "landed", _conversation(40))
        h, budget = job.history, job.budget
        assert wants_precompaction(sum(h.counts) + h.fixed + 256, WINDOW, pre.settings)
        plan = plan_compaction(h.counts, h.results, h.pinned, view_of(None, h.pinned), budget)
        assert plan.action == "compact"
        landed = next_snapshot(Loaded(None, None), "summary", plan, h, budget, "sim-4k")
        assert await services.store.save(job.key, landed)
        await pre.start(job)
        await asyncio.gather(*pre.running.values())
        assert _outcomes(services) == {"covered": 1}
        assert pre.skip_reason(job.key) is None
        assert (await services.store.load(job.key)) == landed
    finally:
        await services.aclose()


async def test_a_session_whose_lock_is_held_is_skipped_at_once() -> None:
    services = await _services(wait_for_summary_s=30)
    try:
        pre = services.precompactor
        job = await _job(services, "busy", _conversation(40))
        holder = await services.store.acquire(job.key, 60)
        assert holder is not None
        started = time.monotonic()
        await pre.start(job)
        await asyncio.gather(*pre.running.values())
        assert time.monotonic() - started < 1  # not the 30 s an inline turn would wait
        assert _outcomes(services) == {"skipped_locked": 1}
        assert pre.skip_reason(job.key) is None  # the next turn may try again
        assert await services.store.acquire(job.key, 60) is None  # still the holder's
        assert await services.store.load(job.key) is None
    finally:
        await services.aclose()


async def test_a_failed_background_summary_is_counted_and_backs_off() -> None:
    services = await _services()
    try:
        pre = services.precompactor
        job = await _job(services, "unlucky", _conversation(40))
        await pre.start(job)
        await asyncio.gather(*pre.running.values())
        assert _outcomes(services) == {"failed": 1}
        registry = services.metrics.registry
        assert registry.get_sample_value("compaction_proxy_summary_failures_total") == 1
        assert pre.skip_reason(job.key) == "skipped_backoff"
        assert await services.store.load(job.key) is None
        assert await services.store.acquire(job.key, 1) is not None  # released
    finally:
        await services.aclose()


async def test_aclose_cancels_and_awaits_what_runs_and_starts_nothing_more() -> None:
    services = await _services()
    pre = services.precompactor
    job = await _job(services, "closing", _conversation(2))
    await pre.start(job)
    (task,) = pre.running.values()
    await services.aclose()
    assert task.cancelled()
    assert not pre.running
    await pre.start(job)
    assert not pre.running
    assert _outcomes(services) == {"cancelled": 2}


# End to end.


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

    took, versions = [], []
    for _ in range(30):
        started = time.monotonic()
        chat.say(f"Turn {turn}: {FILLER}")
        took.append(time.monotonic() - started)
        assert chat.last is not None
        versions.append(int(chat.last["x-compaction-version"]))
        turn += 1
    assert chat.say("RECALL launch") == "launch=ok-7731"
    wait_for_idle(url)
    waits = metric(url, "compaction_proxy_inline_summary_waits")
    background = metric(url, "compaction_proxy_compactions_by_trigger", trigger="background")
    assert waits == 0, f"{waits} turns waited on a summary"
    assert max(took) < SUMMARY_MS / 1000, f"slowest turn {max(took):.2f} s"
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
            deadline = time.monotonic() + 5
            while not locks.keys("cp:lock:*"):
                assert time.monotonic() < deadline, "no background summary started"
                time.sleep(0.02)
            stopping = time.monotonic()
        stopped = time.monotonic() - stopping
        assert stopped < SUMMARY_MS / 1000, f"shutdown took {stopped:.2f} s"
        assert locks.keys("cp:lock:*") == []
        sim = stats(slow_summaries)
        assert sim["calls_abandoned"] == 1  # the summary call itself was cancelled
    finally:
        locks.close()
