"""``ResilientStore`` in-process: a remote store that fails on cue, a fake clock for the
cool-down and the lock leases. Requests keep compacting from local state, every
failure is counted, the log stays quiet, and no summarization lock is left behind.
(The same behaviour against a real Redis that is stopped: test_redis_faults.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest

from proxy.core.session import SessionKey, session_from_header
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.pipeline import compacted_view
from proxy.services import Services
from proxy.store import Snapshot
from proxy.store.memory import MemoryStore
from proxy.store.resilient import COOLDOWN_S, LOG_INTERVAL_S, ResilientStore
from tests.support.fakes import (
    TENANT,
    FakeClock,
    FakeUpstream,
    conversation,
    fake_settings,
    make_services,
    metric,
    turn_of,
    until,
)

KEY = session_from_header(TENANT, "s1")
LOCK_TTL = 65.0


class FlakyStore(MemoryStore):
    """The remote store: every operation fails while ``down``, and an operation named in
    ``failures`` fails that many more times."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(ttl_s=3600, clock=clock)
        self.down = False
        self.failures: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def _check(self, op: str) -> None:
        self.calls[op] += 1
        if self.down or self.failures[op] > 0:
            self.failures[op] -= 1
            raise StoreError(f"{op}: connection refused")

    async def load(self, key: SessionKey) -> Snapshot | None:
        self._check("load")
        return await super().load(key)

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        self._check("save")
        return await super().save(key, snapshot)

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        self._check("acquire")
        return await super().acquire(key, ttl_s)

    async def release(self, key: SessionKey, token: str) -> None:
        self._check("release")
        await super().release(key, token)

    async def load_window(self, key: str) -> int | None:
        self._check("load_window")
        return await super().load_window(key)

    async def save_window(self, key: str, tokens: int, ttl_s: float) -> None:
        self._check("save_window")
        await super().save_window(key, tokens, ttl_s)

    async def list_sessions(self, limit: int) -> list[tuple[SessionKey, Snapshot]]:
        self._check("list_sessions")
        return await super().list_sessions(limit)

    async def ping(self) -> bool:
        return not self.down


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def remote(clock: FakeClock) -> FlakyStore:
    return FlakyStore(clock)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics.create()


Make = Callable[..., ResilientStore]


@pytest.fixture
async def make(clock: FakeClock, remote: FlakyStore, metrics: Metrics) -> AsyncIterator[Make]:
    """ResilientStores over ``remote``; background release retries pause ``backoff_s``
    (real seconds: the fake clock decides when a lock expires). Closed afterwards."""
    made: list[ResilientStore] = []

    def build(backoff_s: tuple[float, ...] = (0, 0)) -> ResilientStore:
        local = MemoryStore(ttl_s=3600, clock=clock)
        made.append(
            ResilientStore(remote, local, metrics, release_backoff_s=backoff_s, clock=clock)
        )
        return made[-1]

    yield build
    for store in made:
        await store.aclose()


@pytest.fixture
def store(make: Make) -> ResilientStore:
    return make()


def store_errors(metrics: Metrics, op: str) -> float:
    return metric(metrics, "store_errors", operation=op)


def releases(metrics: Metrics, outcome: str) -> float:
    return metric(metrics, "lock_release_retries", outcome=outcome)


async def compact(services: Services) -> str:
    outcome, _ = await compacted_view(services, await turn_of(services, conversation(14)))
    return outcome.status


async def test_requests_compact_from_local_state_while_the_store_is_down(
    store: ResilientStore,
    remote: FlakyStore,
    clock: FakeClock,
    metrics: Metrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = FakeUpstream()
    services = make_services(fake_settings(), upstream, clock, store=store, metrics=metrics)
    remote.down = True
    with caplog.at_level(logging.WARNING, "proxy.store"):
        assert await compact(services) == "compacted"
        assert await compact(services) == "snapshot", "the local snapshot serves the next turn"

    assert store.degraded
    assert (await store.local.load(KEY) or pytest.fail("not kept locally")).version == 1
    assert sum(remote.calls.values()) == 1, "no request waits on a dead store twice"
    assert store_errors(metrics, "load_window") == 1  # a request's first store call
    assert [r.message for r in caplog.records if "unavailable" in r.message] != []
    assert len(caplog.records) == 1
    # The lock taken locally meanwhile is free again: the next summary is not held up.
    assert await store.acquire(KEY, LOCK_TTL) is not None


async def test_failures_are_counted_each_time_and_logged_once_per_interval(
    store: ResilientStore,
    remote: FlakyStore,
    clock: FakeClock,
    metrics: Metrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    remote.down = True
    with caplog.at_level(logging.WARNING, "proxy.store"):
        for _ in range(3):
            assert await store.load(KEY) is None
            clock.advance(COOLDOWN_S)  # each time the remote is tried again, and fails
        assert store_errors(metrics, "load") == 3
        assert len(caplog.records) == 1
        clock.advance(LOG_INTERVAL_S)
        await store.load(KEY)
    assert len(caplog.records) == 2
    assert "(2 more since the last report)" in caplog.records[-1].message


async def test_the_remote_store_is_tried_again_after_the_cooldown(
    store: ResilientStore, remote: FlakyStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    remote.down = True
    assert await store.acquire(KEY, LOCK_TTL) is not None  # a local lock
    remote.down = False
    clock.advance(COOLDOWN_S / 2)
    assert await store.load(KEY) is None
    assert remote.calls["load"] == 0, "not before the cool-down is over"
    clock.advance(COOLDOWN_S)
    with caplog.at_level(logging.WARNING, "proxy.store"):
        snapshot = Snapshot(1, "s", 1, 3, 3, "h", 10, 100, 50, 0.0, 0.0)
        assert await store.save(KEY, snapshot)
    assert await remote.load(KEY) == snapshot
    assert any("reachable again" in r.message for r in caplog.records)


async def test_a_failed_lock_release_is_retried_in_the_background(
    store: ResilientStore, remote: FlakyStore, metrics: Metrics
) -> None:
    token = await store.acquire(KEY, LOCK_TTL)
    assert token is not None
    remote.failures["release"] = 2  # the release, and its first retry
    await store.release(KEY, token)
    await until(lambda: releases(metrics, "released") == 1)
    assert remote.calls["release"] == 3
    assert await remote.acquire(KEY, LOCK_TTL) is not None, "the remote lock is gone"


async def test_the_next_acquire_settles_a_release_still_owed(
    make: Make, remote: FlakyStore, clock: FakeClock, metrics: Metrics
) -> None:
    store = make(backoff_s=(30,))  # retries far apart: the session's next turn comes first
    token = await store.acquire(KEY, LOCK_TTL)
    assert token is not None
    remote.failures["release"] = 1
    await store.release(KEY, token)
    await asyncio.sleep(0)  # the retry starts its pause
    clock.advance(COOLDOWN_S)

    assert await store.acquire(KEY, LOCK_TTL) is not None, "not held up by its own old lock"
    await until(lambda: releases(metrics, "released") == 1)


async def test_release_retries_stop_at_the_locks_own_expiry(
    make: Make, remote: FlakyStore, metrics: Metrics
) -> None:
    store = make(backoff_s=(30,))
    token = await store.acquire(KEY, 10)
    assert token is not None
    remote.failures["release"] = 1
    await store.release(KEY, token)
    await until(lambda: releases(metrics, "expired") == 1)
    assert remote.calls["release"] == 1, "the lock expires before the retry would run"


async def test_closing_the_store_cancels_pending_release_retries(
    make: Make, remote: FlakyStore, metrics: Metrics
) -> None:
    store = make(backoff_s=(30,))
    token = await store.acquire(KEY, LOCK_TTL)
    assert token is not None
    remote.failures["release"] = 1
    await store.release(KEY, token)
    await asyncio.sleep(0)  # the retry starts its pause
    await asyncio.wait_for(store.aclose(), 1)
    assert releases(metrics, "cancelled") == 1


async def test_learned_windows_and_listings_survive_an_outage(
    store: ResilientStore, remote: FlakyStore, metrics: Metrics
) -> None:
    remote.down = True
    await store.save_window("up|m", 2048, 60)
    assert await store.load_window("up|m") == 2048
    assert await store.list_sessions(10) == []
    assert not await store.delete(KEY)
    assert not await store.ping()
    assert store_errors(metrics, "save_window") == 1
