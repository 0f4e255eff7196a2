"""Background pre-compaction (issue 11): the decisions, in-process.

End to end (summaries slowed far beyond a chat answer, so a turn that waits on one
shows in its latency): tests/e2e/test_precompact_e2e.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.compaction.precompact import Precompactor, background_budget, wants_precompaction
from proxy.compaction.snapshots import next_snapshot
from proxy.config import CompactionSettings, Settings, load_settings
from proxy.core.budget import Budget
from proxy.core.plan import plan_compaction
from proxy.core.snapshot import Loaded, view_of
from proxy.errors import ConfigError
from tests.support.chat import FILLER, WINDOW
from tests.support.precompaction import (
    _conversation,
    _job,
    _outcomes,
    _services,
)

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
    with pytest.raises(ConfigError, match=r"precompact\.ratio must be below trigger_ratio"):
        load_settings(compaction={"precompact_ratio": ratio})


def test_precompaction_can_be_switched_off() -> None:
    assert Settings(compaction={"precompact_ratio": None}).compaction.precompact.ratio is None
    assert Settings(compaction={"precompact_ratio": 0}).compaction.precompact.ratio == 0


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
        plan = plan_compaction(h, view_of(None, h.pinned), budget)
        assert plan.action == "compact"
        landed = next_snapshot(Loaded(None, None), "summary", plan, job)
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


def test_a_held_background_plan_folds_in_to_land_at_the_target_at_the_trigger() -> None:
    settings = CompactionSettings(trigger_ratio=0.8, target_ratio=0.5, precompact_ratio=0.6)
    budget = Budget(
        window=10_000, reserve=256, fixed=0, trigger=8000, target=5000, summary_allowance=460
    )
    early = background_budget(budget, settings, held=True)
    # Started at 0.6, held until 0.8: the 0.2 grown meanwhile on top of 0.3 lands at 0.5.
    assert (early.trigger, early.target) == (6000, 3000)
