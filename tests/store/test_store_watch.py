"""Issue 23 item 3 in-process: a shared store that answers but refuses (MOVED, READONLY,
OOM) or does not answer, on a fake clock. Every failed call is counted by kind and every
call served locally is too; the store reads as failing until a write succeeds; each cause
is logged once and "shared again" once; readiness probes with a write when no write was
seen lately. (Against real redis-servers: tests/e2e/test_store_health_e2e.py.)"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from redis import exceptions as rx

from proxy.core.session import SessionKey, session_from_header
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Sighting, Snapshot
from proxy.store.health import COOLDOWN_S, PROBE_AFTER_S
from proxy.store.memory import MemoryStore
from proxy.store.resilient import ResilientStore
from tests.support.fakes import TENANT, FakeClock

KEY = session_from_header(TENANT, "s1")
READONLY = rx.ReadOnlyError("You can't write against a read only replica.")
OOM = rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
MOVED = rx.MovedError("3999 127.0.0.1:6381")
REFUSED = rx.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


class RefusingStore(MemoryStore):
    """The remote store: while ``refusal`` is set, its writes (and its reads too with
    ``reads_refused``) raise ``StoreError`` from it, as RedisStore does."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(ttl_s=3600, clock=clock)
        self.refusal: Exception | None = None
        self.reads_refused = False
        self.calls: Counter[str] = Counter()

    def _check(self, op: str, *, write: bool = True) -> None:
        self.calls[op] += 1
        if self.refusal is not None and (write or self.reads_refused):
            raise StoreError(f"redis {op} failed") from self.refusal

    async def load(self, key: SessionKey) -> Snapshot | None:
        self._check("load", write=False)
        return await super().load(key)

    async def load_window(self, key: str) -> int | None:
        self._check("load_window", write=False)
        return await super().load_window(key)

    async def load_seen(self, key: SessionKey) -> Sighting | None:
        self._check("load_seen", write=False)
        return await super().load_seen(key)

    async def save_window(self, key: str, tokens: int, ttl_s: float) -> None:
        self._check("save_window")
        await super().save_window(key, tokens, ttl_s)

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        self._check("save")
        return await super().save(key, snapshot)

    async def note_seen(self, key: SessionKey, sighting: Sighting) -> None:
        self._check("note_seen")
        await super().note_seen(key, sighting)

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        self._check("acquire")
        return await super().acquire(key, ttl_s)

    async def probe(self) -> None:
        self._check("probe")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def remote(clock: FakeClock) -> RefusingStore:
    return RefusingStore(clock)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics.create()


@pytest.fixture
async def store(
    remote: RefusingStore, clock: FakeClock, metrics: Metrics
) -> AsyncIterator[ResilientStore]:
    store = ResilientStore(remote, MemoryStore(ttl_s=3600, clock=clock), metrics, clock=clock)
    yield store
    await store.aclose()


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"compaction_proxy_{name}", labels) or 0.0


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def snap(version: int, summary: str = "s") -> Snapshot:
    return Snapshot(version, summary, 1, 3, 3, "h", 10, 100, 50, 0.0, 0.0)


async def test_a_store_that_refuses_is_tried_on_every_call_and_each_failure_counted(
    store: ResilientStore, remote: RefusingStore, metrics: Metrics
) -> None:
    remote.refusal = READONLY
    for version in range(1, 11):
        assert await store.save(KEY, snap(version))  # kept locally
    assert remote.calls["save"] == 10, "a refusal costs a round trip: no cool-down"
    assert not store.degraded
    assert value(metrics, "store_failures_total", kind="readonly") == 10
    assert value(metrics, "store_errors_total", operation="save") == 10
    assert value(metrics, "store_fallbacks_total", operation="save") == 10
    assert value(metrics, "store_degraded") == 1
    assert str(await store.health()) == "degraded (readonly)"


async def test_reads_that_succeed_neither_end_the_failure_nor_say_shared_again(
    store: ResilientStore,
    remote: RefusingStore,
    clock: FakeClock,
    metrics: Metrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    remote.refusal = READONLY  # a replica: reads answered, writes refused
    with caplog.at_level(logging.WARNING, "proxy.store"):
        for n in range(5):
            await store.note_seen(KEY, Sighting(n, 10, "m", 0.0))
            assert await store.load_window("up|m") is None  # answered by the store
            clock.advance(1)
        assert value(metrics, "store_degraded") == 1
        assert lines(caplog, "reachable again") == []
        assert len(lines(caplog, "store unavailable (readonly")) == 1

        # What the store refused to keep, this replica still answers with.
        assert await store.load_seen(KEY) == Sighting(4, 10, "m", 0.0)
        await store.save_window("up|m", 2048, 60)
        assert await store.load_window("up|m") == 2048

        remote.refusal = None  # promoted: writes succeed
        await store.note_seen(KEY, Sighting(9, 10, "m", 0.0))
        await store.note_seen(KEY, Sighting(10, 10, "m", 0.0))
    assert value(metrics, "store_degraded") == 0
    assert str(await store.health()) == "ok"
    assert len(lines(caplog, "reachable again")) == 1
    assert value(metrics, "store_failures_total", kind="readonly") == 6  # 5 notes, 1 window


async def test_each_distinct_cause_is_logged_once_not_each_time_it_alternates(
    store: ResilientStore, remote: RefusingStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "proxy.store"):
        for n in range(10):
            remote.refusal = (READONLY, OOM)[n % 2]
            await store.save(KEY, snap(n + 1))
    assert len(lines(caplog, "store unavailable (readonly")) == 1
    assert len(lines(caplog, "store unavailable (oom")) == 1
    assert len(caplog.records) == 2


async def test_readiness_probes_with_a_write_when_none_was_seen_lately(
    store: ResilientStore, remote: RefusingStore, clock: FakeClock, metrics: Metrics
) -> None:
    remote.refusal = OOM  # a full Redis: nothing writes, a PING would pass
    assert str(await store.health()) == "degraded (oom)"
    assert remote.calls["probe"] == 1
    assert str(await store.health()) == "degraded (oom)"
    assert remote.calls["probe"] == 1, "a failure just seen needs no probe"
    assert value(metrics, "store_errors_total", operation="probe") == 1
    assert value(metrics, "store_degraded") == 1

    remote.refusal = None
    clock.advance(PROBE_AFTER_S)
    assert str(await store.health()) == "ok"
    assert remote.calls["probe"] == 2
    assert value(metrics, "store_degraded") == 0
    await store.save(KEY, snap(1))
    clock.advance(PROBE_AFTER_S / 2)
    assert str(await store.health()) == "ok"
    assert remote.calls["probe"] == 2, "a write just seen says enough"


async def test_a_store_that_does_not_answer_is_left_alone_and_readiness_finds_it_back(
    store: ResilientStore, remote: RefusingStore, clock: FakeClock, metrics: Metrics
) -> None:
    remote.refusal, remote.reads_refused = REFUSED, True
    assert await store.load(KEY) is None
    for _ in range(5):
        assert await store.load(KEY) is None
    assert remote.calls["load"] == 1, "no call waits on a dead server twice per cool-down"
    assert store.degraded
    assert value(metrics, "store_failures_total", kind="connection") == 1
    assert value(metrics, "store_fallbacks_total", operation="load") == 6
    assert str(await store.health()) == "unreachable (connection)"

    remote.refusal = None
    clock.advance(PROBE_AFTER_S)
    assert clock() < 1000.0 + COOLDOWN_S + PROBE_AFTER_S
    assert str(await store.health()) == "ok", "the probe is tried even in the cool-down"
    assert not store.degraded
    await store.load(KEY)
    assert remote.calls["load"] == 2


async def test_while_failing_a_snapshot_saved_locally_wins_over_the_stores_older_one(
    store: ResilientStore, remote: RefusingStore, metrics: Metrics
) -> None:
    """A full Redis answers reads: the next turn must not summarize v1 again."""
    assert await store.save(KEY, snap(1, "shared"))
    remote.refusal = OOM
    # Its first refusal: this replica's local state has no v1 to put that v2 on.
    assert not await store.save(KEY, snap(2, "lost"))
    loaded = await store.load(KEY)  # the next compaction starts from the store's v1...
    assert loaded is not None
    assert loaded.summary == "shared"
    assert await store.save(KEY, snap(2, "mine")), "...and its v2 is kept locally"
    loaded = await store.load(KEY)
    assert loaded is not None
    assert (loaded.version, loaded.summary) == (2, "mine"), "not summarized again"
    assert [s and s.version for s in await store.load_many([KEY])] == [2]
    assert value(metrics, "store_fallbacks_total", operation="load") == 2
    other = session_from_header(TENANT, "new while full")
    assert await store.load(other) is None
    assert await store.save(other, snap(1))
    assert await store.save(other, snap(2))  # a session begun meanwhile keeps its chain

    remote.refusal = None
    assert await store.save(KEY, snap(2, "theirs"))  # the store's own v2, shared again
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "theirs", "once writes succeed the store is the truth again"
