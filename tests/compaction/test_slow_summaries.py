"""A slow summarizer, in-process: the back-off after a failed summary grows with what the
attempt cost, and what summaries take is learned per tenant and model (pace.py)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from proxy.compaction.backoff import COST_FACTOR, SummaryBackoff
from proxy.compaction.pace import SummaryPace
from proxy.config import ModelSpec
from proxy.core.outcome import Outcome
from proxy.core.session import session_from_header
from proxy.errors import UpstreamUnavailable
from proxy.pipeline import compacted_view
from proxy.services import Services
from proxy.upstream.api import Attempt
from tests.support.fakes import (
    MODEL,
    TENANT,
    FakeClock,
    FakeUpstream,
    Reply,
    conversation,
    fake_settings,
    make_services,
    metric,
    summary_reply,
    turn_of,
)

KEY = session_from_header(TENANT, "s1")


def test_a_failed_attempt_backs_off_at_least_four_times_its_cost() -> None:
    clock = FakeClock()
    backoff = SummaryBackoff(first_s=30, max_s=900, clock=clock)
    backoff.failed(KEY, cost_s=300)  # five minutes on the only slot, then timed out
    clock.advance(COST_FACTOR * 300 - 1)
    assert backoff.active(KEY), "a 30 s back-off would bring it back after 30 s"
    clock.advance(2)
    assert not backoff.active(KEY)


def test_a_quick_failure_still_backs_off_by_the_clock() -> None:
    clock = FakeClock()
    backoff = SummaryBackoff(first_s=30, max_s=900, clock=clock)
    backoff.failed(KEY, cost_s=0.5)
    clock.advance(29)
    assert backoff.active(KEY)
    clock.advance(2)
    assert not backoff.active(KEY)


async def test_a_summary_that_fails_after_minutes_backs_the_session_off_for_longer() -> None:
    """The compactor passes the attempt's time: the fake clock moves 200 s while the
    summary call is out, then it fails."""
    clock, upstream = FakeClock(), FakeUpstream()
    services = make_services(fake_settings(precompact_ratio=None), upstream, clock)
    gate = asyncio.Event()
    upstream.script(summaries=[Reply(gate=gate, error=UpstreamUnavailable("timed out"))])
    turn = await turn_of(services, conversation(14))
    viewing = asyncio.create_task(compacted_view(services, turn))
    await asyncio.wait_for(upstream.summary_started.wait(), 5)
    clock.advance(200)
    gate.set()
    outcome, _ = await viewing
    assert outcome.degraded == "summary_failed"
    clock.advance(COST_FACTOR * 200 - 10)  # far past the 30 s of the clock's back-off
    assert services.compactor.backoff.active(KEY)
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    assert outcome.degraded == "backoff"
    assert len(upstream.summary_calls) == 1
    assert metric(services.metrics, "compactions", trigger="threshold", outcome="backoff") == 1


def test_pace_learns_a_models_summary_time_and_speed() -> None:
    clock = FakeClock()
    pace = SummaryPace(ttl_s=900, clock=clock)
    assert pace.expected_s(TENANT, "m") is None
    pace.finished(TENANT, "m", 4.0, 200)
    assert pace.expected_s(TENANT, "m") == 4.0
    assert pace.speed(TENANT, "m") == 50.0
    pace.finished(TENANT, "m", 2.0, None)  # the newest weighs half
    assert pace.expected_s(TENANT, "m") == 3.0
    assert pace.speed(TENANT, "m") == 50.0


def test_pace_keeps_a_dropped_summary_as_a_lower_bound() -> None:
    clock = FakeClock()
    pace = SummaryPace(ttl_s=900, clock=clock)
    pace.ran_out(TENANT, "m", 1.0)
    assert pace.expected_s(TENANT, "m") == 1.0
    pace.finished(TENANT, "m", 0.5, 10)
    pace.ran_out(TENANT, "m", 2.0)
    assert pace.expected_s(TENANT, "m") == 2.0


@pytest.mark.parametrize(("tenant", "model"), [("other-tenant", "m"), (TENANT, "other-model")])
def test_pace_is_per_tenant_and_model(tenant: str, model: str) -> None:
    pace = SummaryPace(ttl_s=900, clock=FakeClock())
    pace.ran_out(TENANT, "m", 60.0)
    assert pace.expected_s(tenant, model) is None


def test_pace_is_measured_again_once_its_knowledge_expires() -> None:
    clock = FakeClock()
    pace = SummaryPace(ttl_s=900, clock=clock)
    pace.ran_out(TENANT, "m", 60.0)
    clock.advance(901)
    assert pace.expected_s(TENANT, "m") is None


# The turn's deadline (turn_deadline.py), in-process: a summary held at the fake upstream.

DEADLINE_S = 0.05  # real seconds: the turn waits this long, then goes without the summary


def _deadline_services(
    upstream: FakeUpstream, *, precompact: bool, deadline_s: float = DEADLINE_S
) -> Services:
    settings = fake_settings(precompact_ratio=None, summary_deadline_s=deadline_s)
    model = ModelSpec(
        match=MODEL, context_window=4096, max_output_tokens=256, precompact=precompact
    )
    settings = settings.model_copy(update={"models": [model]})
    return make_services(settings, upstream, FakeClock())


async def test_past_its_deadline_a_turn_goes_without_the_summary_which_lands_later() -> None:
    upstream, gate = FakeUpstream(), asyncio.Event()
    upstream.script(summaries=[summary_reply(gate=gate)])
    services = _deadline_services(upstream, precompact=True)
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    assert outcome.degraded == "summary_deadline"
    assert outcome.version == 0  # served as it was (it still fits), no summary in it
    assert KEY in services.precompactor.running  # finishing in the background
    gate.set()
    await asyncio.wait_for(services.precompactor.running[KEY], 5)
    stored = await services.store.load(KEY)
    assert stored is not None
    assert stored.version == 1
    assert metric(services.metrics, "precompactions", outcome="compacted") == 1


async def test_past_its_deadline_a_single_slot_models_summary_is_dropped() -> None:
    """``precompact: false``: cancelled, the session backed off by its time, the model's
    summaries known to take at least that long and to write fewer tokens a second than
    it was allowed in that time: the next session's summary asks for fewer (pace.py),
    until not even the shortest would finish, and then no summary is asked for."""
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(gate=asyncio.Event()) for _ in range(8)])
    # Long enough that a busy machine's overhead on the first drop (its measured cost)
    # leaves the second ask above the shortest summary: 400 * 0.5 / cost >= 128.
    services = _deadline_services(upstream, precompact=False, deadline_s=0.5)
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    assert outcome.degraded == "summary_deadline"
    assert not services.precompactor.running
    assert upstream.responses == []  # the call was cancelled before any answer
    assert metric(services.metrics, "compactions", trigger="threshold", outcome="dropped") == 1
    expected = services.deadline.pace.expected_s(TENANT, MODEL)
    assert expected is not None
    assert expected >= 0.5
    assert services.compactor.backoff.active(KEY)
    degraded = []
    for n in range(2, 8):  # other sessions: each its own back-off
        other = await turn_of(services, conversation(14), session=f"s{n}")
        outcome, _ = await compacted_view(services, other)
        degraded.append(outcome.degraded)
        if outcome.degraded == "summary_slow":
            break
    asked = [call.body["max_tokens"] for call in upstream.summary_calls]
    assert degraded[-1] == "summary_slow", degraded
    assert set(degraded[:-1]) == {"summary_deadline"}
    assert len(asked) == len(degraded)  # the last session asked for none
    assert all(later <= earlier // 2 for earlier, later in itertools.pairwise(asked)), asked
    assert asked[-1] >= 128  # never one shorter than the shortest summary
    assert metric(services.metrics, "compactions", trigger="threshold", outcome="too_slow") == 1


def test_pace_bounds_the_speed_by_what_an_unfinished_summary_was_allowed() -> None:
    pace = SummaryPace(ttl_s=900, clock=FakeClock())
    assert pace.affordable(TENANT, "m", 60.0) is None  # not known: not sized
    pace.finished(TENANT, "m", 10.0, 500)  # 50 tokens a second
    assert pace.affordable(TENANT, "m", 60.0) == 1500  # half the time, at that speed
    pace.ran_out(TENANT, "m", 60.0, 600)  # 600 allowed, unfinished after 60 s: < 10/s
    assert pace.speed(TENANT, "m") == 10.0
    assert pace.affordable(TENANT, "m", 60.0) == 300
    pace.ran_out(TENANT, "m", 60.0, 1200)  # a looser bound keeps the tighter one
    assert pace.speed(TENANT, "m") == 10.0


def test_pace_asks_nothing_more_once_a_summary_sized_by_a_bound_runs_out_too() -> None:
    """The real-model bench's 4k run (bench/README.md): each halving cost its turn a whole
    deadline, three in all, though the time was in reading the prompt, not in writing."""
    pace = SummaryPace(ttl_s=900, clock=FakeClock())
    pace.ran_out(TENANT, "m", 30.0, 600)  # 600 allowed, unfinished: at most 20 a second
    asked = pace.affordable(TENANT, "m", 30.0)
    assert asked == 300  # worth one try: the time may have been in the writing
    pace.ran_out(TENANT, "m", 30.0, asked)  # half of that bound's time was not enough
    assert pace.affordable(TENANT, "m", 30.0) == 0  # not the 150 a third deadline would wait
    pace.ran_out(TENANT, "m", 60.0, 400)  # a background one's time-out does not revive it
    assert pace.affordable(TENANT, "m", 30.0) == 0


async def test_a_summary_asks_for_no_more_than_its_summarizer_writes_in_its_time() -> None:
    """A background-capable model: sized to ``summary_timeout_s``, not the deadline."""
    upstream = FakeUpstream()
    services = make_services(fake_settings(precompact_ratio=None), upstream, FakeClock())
    services.compactor.folder.pace.finished(TENANT, MODEL, 20.0, 100)  # 5 tokens a second
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    assert outcome.status == "compacted"
    [call] = upstream.summary_calls
    assert call.body["max_tokens"] == 150  # 5/s for half of the 60 s timeout, not 400


async def test_no_summary_is_asked_of_a_summarizer_too_slow_for_the_shortest() -> None:
    upstream = FakeUpstream()
    services = make_services(fake_settings(precompact_ratio=None), upstream, FakeClock())
    services.compactor.folder.pace.finished(TENANT, MODEL, 20.0, 20)  # 1 token a second
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    assert outcome.degraded == "summary_failed"
    assert upstream.summary_calls == []
    assert metric(services.metrics, "summary_failures") == 1
    assert services.compactor.backoff.active(KEY)


async def test_a_timed_out_summary_teaches_its_speed() -> None:
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(gate=asyncio.Event())])  # never answers
    settings = fake_settings(precompact_ratio=None, summary_timeout_s=0.05)
    services = make_services(settings, upstream, FakeClock())
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    assert outcome.degraded == "summary_failed"
    speed = services.compactor.folder.pace.speed(TENANT, MODEL)
    assert speed is not None
    assert speed <= 400 / 0.05  # 400 tokens allowed, none back within 0.05 s
    other = await turn_of(services, conversation(14), session="s2")
    await compacted_view(services, other)
    assert upstream.summary_calls[1].body["max_tokens"] <= 200


async def test_a_turn_sent_while_a_summary_runs_on_its_model_says_so() -> None:
    upstream, gate = FakeUpstream(), asyncio.Event()
    upstream.script(summaries=[summary_reply(gate=gate)])
    services = _deadline_services(upstream, precompact=True)
    await compacted_view(services, await turn_of(services, conversation(14)))
    turn = await turn_of(services, conversation(2), session="s2")
    attempt = Attempt(b"{}", Outcome.passthrough(b"{}", 4096))
    marked = services.precompactor.note_sent(turn, attempt)
    assert marked.outcome.degraded == "summary_busy"
    assert metric(services.metrics, "turns_sent_during_summary") == 1
    gate.set()
    await asyncio.wait_for(services.precompactor.running[KEY], 5)
    assert services.precompactor.note_sent(turn, attempt).outcome.degraded is None
