"""The compaction orchestration in-process: single flight, waiters, re-planning after
the lock, compare-and-swap, summarizer failures (``proxy.compaction.compact``), steps 3-8 of
``proxy.pipeline``.

The upstream is ``tests.support.fakes.FakeUpstream`` behind the ``Upstream`` seam and time is a
``FakeClock``: a summary stays in flight until the test lets it go, and waits run out
when the test says so, so every interleaving here is decided, not raced.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import orjson
import pytest

from proxy.compaction.compact import _POLL_S
from proxy.compaction.summarize import TERSER
from proxy.core.outcome import Outcome
from proxy.core.passages import Original
from proxy.core.session import SessionKey, session_from_header
from proxy.errors import UpstreamUnavailable
from proxy.pipeline import compacted_view
from proxy.services import Services
from proxy.store import Dropped, Snapshot
from proxy.store.memory import MemoryStore
from proxy.types import ChatMessage, ToolCall
from tests.support.fakes import (
    FILLER,
    TENANT,
    FakeClock,
    FakeUpstream,
    Reply,
    conversation,
    error_reply,
    fake_settings,
    make_services,
    metric,
    summary_reply,
    turn_of,
    until,
)
from tests.support.faulty_upstream import handoff

T = TypeVar("T")
CONCURRENT = 5


async def view(
    services: Services, messages: list[ChatMessage], session: str = "s1", **kw: bool
) -> Outcome:
    """Steps 3-8 for one request: what the upstream would see of ``messages``."""
    outcome, _ = await compacted_view(services, await turn_of(services, messages, session), **kw)
    return outcome


def key(session: str = "s1") -> SessionKey:
    return session_from_header(TENANT, session)


async def stored(services: Services, session: str = "s1") -> Snapshot | None:
    return await services.store.load(key(session))


async def within(awaitable: Awaitable[T], seconds: float = 2.0) -> T:
    """Bounded: an interleaving bug shows up as a failure, not a hung suite."""
    return await asyncio.wait_for(awaitable, seconds)


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def services(upstream: FakeUpstream, clock: FakeClock) -> Services:
    return make_services(fake_settings(), upstream, clock)


# --- single flight ----------------------------------------------------------------------


async def test_concurrent_requests_for_one_session_ask_for_one_summary(
    services: Services, upstream: FakeUpstream, clock: FakeClock
) -> None:
    gate = asyncio.Event()
    upstream.script(summaries=[summary_reply(handoff("shared summary"), gate=gate)])
    history = conversation(14)

    tasks = [asyncio.create_task(view(services, history)) for _ in range(CONCURRENT)]
    await within(upstream.summary_started.wait())
    # The others find the lock taken and wait for the holder's snapshot meanwhile.
    await until(lambda: clock.sleeps >= CONCURRENT - 1 or len(upstream.summary_calls) > 1)
    assert len(upstream.summary_calls) == 1
    assert not any(t.done() for t in tasks)
    gate.set()
    outcomes = await within(asyncio.gather(*tasks))

    assert len(upstream.summary_calls) == 1
    assert sorted(o.status for o in outcomes) == ["compacted"] + ["snapshot"] * (CONCURRENT - 1)
    assert {o.version for o in outcomes} == {1}
    first = outcomes[0].messages
    assert first is not None
    assert "shared summary" in orjson.dumps(first).decode()
    assert all(o.messages == first for o in outcomes), "waiters send the holder's view"
    snapshot = await stored(services)
    assert snapshot is not None
    assert (snapshot.version, snapshot.summary) == (1, handoff("shared summary"))
    assert metric(services.metrics, "compactions", trigger="threshold", outcome="compacted") == 1
    snapshots = metric(services.metrics, "compactions", trigger="threshold", outcome="snapshot")
    assert snapshots == CONCURRENT - 1


async def test_requests_for_different_sessions_summarize_side_by_side(
    services: Services, upstream: FakeUpstream
) -> None:
    gate = asyncio.Event()
    upstream.script(summaries=[summary_reply(gate=gate), summary_reply(gate=gate)])
    history = conversation(14)
    tasks = [asyncio.create_task(view(services, history, session)) for session in ("a", "b")]
    await within(until(lambda: len(upstream.summary_calls) == 2))
    gate.set()
    outcomes = await within(asyncio.gather(*tasks))
    assert [o.status for o in outcomes] == ["compacted", "compacted"]


# --- the lock holder gives up, or is gone ----------------------------------------------


async def test_a_failed_summary_trims_counts_and_frees_its_waiters(
    services: Services, upstream: FakeUpstream, clock: FakeClock
) -> None:
    gate = asyncio.Event()
    upstream.script(summaries=[error_reply(500, gate=gate)])
    history = conversation(22)  # over the window: without a summary, only trimming fits it

    holder = asyncio.create_task(view(services, history))
    await within(upstream.summary_started.wait())
    waiter = asyncio.create_task(view(services, history))
    await until(lambda: clock.sleeps >= 1)
    gate.set()
    outcomes = await within(asyncio.gather(holder, waiter))

    assert [o.status for o in outcomes] == ["trimmed", "trimmed"]
    assert len(upstream.summary_calls) == 1, "the waiter does not summarize in its turn"
    assert await stored(services) is None, "nothing saved: the next turn summarizes again"
    assert metric(services.metrics, "summary_failures") == 1
    assert clock.now == 1000.0, "the waiter saw the lock free: no wait ran out"
    messages = outcomes[0].messages
    assert messages is not None
    assert len(messages) < len(history)
    assert messages[-1] == history[-1]


async def test_an_unreachable_summarizer_trims_instead(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(summaries=[Reply(error=UpstreamUnavailable("refused"))])
    outcome = await view(services, conversation(22))
    assert outcome.status == "trimmed"
    assert metric(services.metrics, "summary_failures") == 1
    assert await services.store.acquire(key(), 1) is not None, "its lock was released"


async def test_a_summary_cut_off_twice_is_not_kept(
    services: Services, upstream: FakeUpstream
) -> None:
    cut = summary_reply(handoff("half a sum"), finish_reason="length")
    upstream.script(summaries=[cut, cut])
    outcome = await view(services, conversation(22))

    assert outcome.status == "trimmed"
    assert await stored(services) is None
    calls = upstream.summary_calls
    assert len(calls) == 2
    terser = TERSER.format(limit=calls[0].body["max_tokens"])
    assert calls[1].messages[-1]["content"].endswith(terser)
    metrics = services.metrics
    assert metric(metrics, "summaries_truncated") == 1
    assert metric(metrics, "summary_length_retries") == 1
    assert metric(metrics, "summary_failures") == 1


async def test_a_summary_cut_off_once_is_asked_again_tersely_and_kept(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(
        summaries=[
            summary_reply(handoff("half a sum"), finish_reason="length"),
            summary_reply(handoff("terse and whole")),
        ]
    )
    outcome = await view(services, conversation(14))
    assert outcome.status == "compacted"
    snapshot = await stored(services)
    assert snapshot is not None
    assert snapshot.summary == handoff("terse and whole")
    assert metric(services.metrics, "summary_length_retries") == 1
    assert metric(services.metrics, "summaries_truncated") == 0


async def test_a_dead_holders_lock_is_waited_out_once_then_taken_when_it_expires(
    upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(advance_on_sleep=True)  # every poll of the waiter takes its time
    services = make_services(fake_settings(), upstream, clock)
    c = services.settings.compaction
    lock_ttl = c.summary_timeout_s + 5
    # Another replica took the session's lock and died mid-summary.
    assert await services.store.acquire(key(), lock_ttl) is not None
    history = conversation(22)

    with caplog.at_level(logging.WARNING, "proxy.compaction"):
        first = await within(view(services, history))
    assert first.status == "trimmed"
    assert clock.now - 1000.0 == pytest.approx(c.wait_for_summary_s, abs=_POLL_S)
    assert [r.message for r in caplog.records if "waited" in r.message], "the wait is logged"

    polls = clock.sleeps
    second = await within(view(services, history))
    assert second.status == "trimmed"
    assert clock.sleeps == polls, "a lock already waited out is not waited for again"
    assert upstream.summary_calls == []

    clock.advance(lock_ttl)  # the dead holder's lock expires
    third = await within(view(services, history))
    assert third.status == "compacted"
    assert len(upstream.summary_calls) == 1


# --- another request compacted first --------------------------------------------------


class PausedLocks(MemoryStore):
    """A replica's view of a shared store whose next ``acquire`` waits until ``go`` is set:
    what happens to the session meanwhile is up to the test."""

    def __init__(self, shared: MemoryStore) -> None:
        self.shared = shared
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        self.waiting.set()
        await self.go.wait()
        return await self.shared.acquire(key, ttl_s)

    async def release(self, key: SessionKey, token: str) -> None:
        await self.shared.release(key, token)

    async def load(self, key: SessionKey) -> Snapshot | None:
        return await self.shared.load(key)

    async def load_many(self, keys: list[SessionKey]) -> list[Snapshot | None]:
        return await self.shared.load_many(keys)

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        return await self.shared.save(key, snapshot)

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        return await self.shared.archive(key, originals)

    async def load_archive(self, key: SessionKey) -> list[Original]:
        return await self.shared.load_archive(key)

    async def load_window(self, key: str) -> int | None:
        return await self.shared.load_window(key)


def replicas(upstream: FakeUpstream, clock: FakeClock) -> tuple[Services, Services, PausedLocks]:
    """Two replicas on one store; the first stops just before taking the session's lock."""
    shared = MemoryStore(ttl_s=3600, clock=clock)
    paused = PausedLocks(shared)
    first = make_services(fake_settings(), upstream, clock, store=paused)
    return first, make_services(fake_settings(), upstream, clock, store=shared), paused


async def test_a_request_that_finds_the_compaction_done_under_the_lock_uses_it(
    upstream: FakeUpstream, clock: FakeClock
) -> None:
    a, b, paused = replicas(upstream, clock)
    upstream.script(summaries=[summary_reply(handoff("by replica b"))])
    history = conversation(14)

    late = asyncio.create_task(view(a, history))  # planned against no snapshot
    await within(paused.waiting.wait())
    done = await view(b, history)  # meanwhile the other replica compacts the session
    assert (done.status, done.version) == ("compacted", 1)
    paused.go.set()
    outcome = await within(late)

    assert len(upstream.summary_calls) == 1, "re-planned from the new snapshot, not repeated"
    assert (outcome.status, outcome.version) == ("snapshot", 1)
    assert outcome.messages == done.messages
    snapshot = await b.store.load(key())
    assert snapshot is not None
    assert snapshot.version == 1


async def test_a_grown_history_re_planned_under_the_lock_summarizes_only_whats_new(
    upstream: FakeUpstream, clock: FakeClock
) -> None:
    a, b, paused = replicas(upstream, clock)
    upstream.script(
        summaries=[summary_reply(handoff("by replica b")), summary_reply(handoff("folded"))]
    )
    history = conversation(14)
    grown = conversation(14, extra=10)  # the same conversation ten turns later

    late = asyncio.create_task(view(a, grown))
    await within(paused.waiting.wait())
    await view(b, history)
    covered = (await b.store.load(key()) or pytest.fail("b saved nothing")).covered
    paused.go.set()
    outcome = await within(late)

    assert (outcome.status, outcome.version) == ("compacted", 2)
    first, second = upstream.summary_calls
    prompt = second.messages[-1]["content"]
    assert re.search(
        rf"<previous_summary_(\w+)>\n{re.escape(handoff('by replica b'))}\n</previous_summary_\1>",
        prompt,
    )
    assert "Turn 0:" in first.messages[-1]["content"]
    assert "Turn 0:" not in prompt, "what b's summary covers is not summarized again"
    snapshot = await b.store.load(key())
    assert snapshot is not None
    assert (snapshot.version, snapshot.summary) == (2, handoff("folded"))
    assert snapshot.covered > covered


async def test_a_summary_that_outlived_its_lock_loses_the_write_to_the_next_holder(
    services: Services, upstream: FakeUpstream, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    upstream.script(
        summaries=[summary_reply(handoff("slow"), gate=gate), summary_reply(handoff("fast"))]
    )
    history = conversation(14)
    slow = asyncio.create_task(view(services, history))
    await within(upstream.summary_started.wait())
    clock.advance(services.settings.compaction.summary_timeout_s + 5)  # its lock expires
    fast = await within(view(services, history))
    assert (fast.status, fast.version) == ("compacted", 1)

    gate.set()
    with caplog.at_level(logging.INFO, "proxy.compaction"):
        outcome = await within(slow)
    # Its own view is as valid as the winner's, so it is still what this request sends.
    assert (outcome.status, outcome.version) == ("compacted", 1)
    assert any("lost a write race" in r.message for r in caplog.records)
    snapshot = await stored(services)
    assert snapshot is not None
    assert snapshot.summary == handoff("fast"), "a stale writer never replaces the snapshot"


# --- what gets a compaction ------------------------------------------------------------


async def test_force_compacts_a_short_history_at_most_once_per_interval(
    services: Services, upstream: FakeUpstream, clock: FakeClock
) -> None:
    history = conversation(3)
    assert (await view(services, history)).status == "passthrough"
    assert (await view(services, history, force=True)).status == "compacted"
    history = [*history, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    assert (await view(services, history, force=True)).status == "snapshot"
    clock.advance(services.settings.compaction.force_interval_s)
    assert (await view(services, history, force=True)).status == "compacted"
    assert len(upstream.summary_calls) == 2


def tool_loop(calls: int) -> list[ChatMessage]:
    """An agent loop: ``calls`` grep calls, each with a ~550-token output."""
    messages: list[ChatMessage] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "grep the logs"},
    ]
    for i in range(calls):
        call: ToolCall = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "grep", "arguments": "{}"},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x=1 log " * 250})
    messages.append({"role": "assistant", "content": "done"})
    messages.append({"role": "user", "content": "and now?"})
    return messages


async def test_eliding_old_tool_outputs_alone_needs_no_summary(
    services: Services, upstream: FakeUpstream
) -> None:
    outcome = await view(services, tool_loop(6))
    assert (outcome.status, outcome.version) == ("compacted", 1)
    assert upstream.summary_calls == []
    snapshot = await stored(services)
    assert snapshot is not None
    assert (snapshot.summary, snapshot.covered) == ("", 1)
    assert snapshot.elide_before > 1
    assert await services.store.acquire(key(), 1) is not None, "no lock was left behind"


async def test_identifiers_the_summary_dropped_are_put_back(
    services: Services, upstream: FakeUpstream
) -> None:
    history = conversation(14)
    history[1] = {"role": "user", "content": f"FACT deploy_id=ZX-4471-QQ {FILLER}"}
    upstream.script(summaries=[summary_reply(handoff("ship it"))])
    outcome = await view(services, history)
    assert outcome.restored >= 1
    snapshot = await stored(services)
    assert snapshot is not None
    assert "ZX-4471-QQ" in snapshot.summary
    assert metric(services.metrics, "identifiers_restored") == outcome.restored
