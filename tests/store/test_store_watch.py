"""Issue 23 item 3 in-process: a shared store that answers but refuses (MOVED, READONLY,
OOM) or does not answer, on a fake clock. Every failed call is counted by kind and every
call served locally is too; the store reads as failing until a write succeeds; each cause
is logged once and "shared again" once; readiness probes with a write when no write was
seen lately. (Against real redis-servers: tests/e2e/test_store_health_e2e.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis import exceptions as rx

from proxy.core.session import SessionKey, session_from_header
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Sighting, Snapshot
from proxy.store.health import (
    COOLDOWN_S,
    PROBE_AFTER_S,
    SETTLE_S,
    Health,
    ProbeFailed,
    StoreWatch,
    jittered_cooldown,
)
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

    def __init__(self, clock: FakeClock, *, one_server: bool = True) -> None:
        super().__init__(ttl_s=3600, clock=clock)
        self.refusal: Exception | None = None
        self.reads_refused = False
        # A full Redis or a replica still runs a script that returns before its write:
        # a compare-and-swap that lost answers 0, no error.
        self.scripts_run = False
        self.calls: Counter[str] = Counter()
        self._one_server = one_server

    @property
    def one_server(self) -> bool:
        return self._one_server

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
        current = await super().load(key)
        lost = (current.version if current else 0) != snapshot.version - 1
        if lost and self.scripts_run:
            self.calls["save"] += 1
        else:
            self._check("save")
        return await super().save(key, snapshot)

    async def release(self, key: SessionKey, token: str) -> None:
        self.calls["release"] += 1  # a DEL: a full Redis still deletes
        await super().release(key, token)

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


@dataclass
class Rig:
    """A resilient store on a refusing remote, its fake clock and metrics."""

    store: ResilientStore
    remote: RefusingStore
    clock: FakeClock
    metrics: Metrics


@pytest.fixture
def rig(store: ResilientStore, remote: RefusingStore, clock: FakeClock, metrics: Metrics) -> Rig:
    return Rig(store, remote, clock, metrics)


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
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    store, remote, clock, metrics = rig.store, rig.remote, rig.clock, rig.metrics
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
        assert value(metrics, "store_degraded") == 1, "a failure just met: not yet"
        clock.advance(SETTLE_S)
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


# Only a write the store performed ends a failure, and only once no call failed for
# SETTLE_S: a full Redis or a replica runs a compare-and-swap that lost (0, no error) and
# deletes, and readiness must not flap with those.


async def test_a_compare_and_swap_that_wrote_nothing_does_not_end_the_failure(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    store, remote, clock, metrics = rig.store, rig.remote, rig.clock, rig.metrics
    assert await store.save(KEY, snap(1, "shared"))
    remote.refusal, remote.scripts_run = OOM, True  # full: the CAS that loses still runs
    with caplog.at_level(logging.WARNING, "proxy.store"):
        await store.note_seen(KEY, Sighting(1, 10, "m", 0.0))  # refused: failing
        assert (await store.load(KEY)) == snap(1, "shared")  # kept locally too now
        assert await store.save(KEY, snap(2, "mine"))  # refused, kept locally
        for version in range(3, 8):
            clock.advance(SETTLE_S)
            # The store is at v1: its CAS of each later version returns 0, no error.
            assert await store.save(KEY, snap(version, "mine"))
            assert remote.calls["save"] == version
            token = await store.acquire(session_from_header(TENANT, f"l{version}"), 60)
            assert token is not None  # refused remotely: a local lock
            await store.delete(session_from_header(TENANT, "gone"))
            assert str(store._watch.health) == "degraded (oom)"
            assert value(metrics, "store_degraded") == 1
        loaded = await store.load(KEY)
        assert loaded is not None
        assert (loaded.version, loaded.summary) == (7, "mine"), "the stale v1 not served"
        assert str(await store.health()) == "degraded (oom)", "the probe is refused too"
    assert lines(caplog, "reachable again") == []


def watch(clock: FakeClock, metrics: Metrics, *, one_server: bool = True) -> StoreWatch:
    return StoreWatch(metrics.store, clock, one_server=one_server, cooldown=lambda: COOLDOWN_S)


def test_a_performed_write_ends_a_failure_only_settle_s_after_the_last_failure(
    clock: FakeClock, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    w = watch(clock, metrics)
    with caplog.at_level(logging.WARNING, "proxy.store"):
        w.failed("save", "oom", StoreError("full"))
        clock.advance(SETTLE_S * 0.9)
        w.failed("note_seen", "oom", StoreError("full"))  # the window starts again
        clock.advance(SETTLE_S * 0.5)
        w.wrote("note_seen")  # taken while memory freed for an instant
        assert str(w.health) == "degraded (oom)"
        assert value(metrics, "store_degraded") == 1
        clock.advance(SETTLE_S * 0.5)
        w.wrote("save")  # SETTLE_S since the last failure
    assert w.health == Health()
    assert value(metrics, "store_degraded") == 0
    assert len(lines(caplog, "reachable again")) == 1
    w.wrote("save")
    assert len(lines(caplog, "reachable again")) == 1, "said once"


def test_readiness_probes_at_most_once_per_settle_s_while_failing(
    clock: FakeClock, metrics: Metrics
) -> None:
    w = watch(clock, metrics)
    assert w.probe_due  # nothing seen yet
    w.probing()
    w.wrote("probe")
    assert not w.probe_due
    clock.advance(PROBE_AFTER_S - 0.1)
    w.wrote("save")
    clock.advance(PROBE_AFTER_S - 0.1)
    assert not w.probe_due, "a write seen lately says enough"
    w.failed("note_seen", "readonly", StoreError("replica"))
    assert w.probe_due, "failing: a probe names it, and may end it"
    w.probing()
    w.failed("probe", "readonly", StoreError("replica"))
    clock.advance(SETTLE_S * 0.9)
    assert not w.probe_due
    clock.advance(SETTLE_S * 0.1)
    assert w.probe_due


def test_on_a_cluster_only_a_probe_of_every_primary_ends_a_failure(
    clock: FakeClock, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    w = watch(clock, metrics, one_server=False)
    full = ProbeFailed("redis probe failed on 1/3 primaries", ["127.0.0.1:7002"], 3)
    with caplog.at_level(logging.WARNING, "proxy.store"):
        w.probing()
        w.failed("probe", "oom", full)
    assert str(w.health) == "degraded (oom, 1/3 primaries)"
    assert [line for line in lines(caplog, "store unavailable") if "127.0.0.1:7002" in line]
    for _ in range(5):
        clock.advance(SETTLE_S)
        w.wrote("save")  # a write to another primary's slots
        assert str(w.health) == "degraded (oom, 1/3 primaries)"
    assert w.probe_due
    w.probing()
    w.wrote("probe")
    assert w.health == Health()
    clock.advance(PROBE_AFTER_S - 0.1)
    w.wrote("save")
    clock.advance(0.1)
    assert w.probe_due, "a write to one primary says nothing of the others"
    down = ProbeFailed("redis probe failed on 1/3 primaries", ["127.0.0.1:7001"], 3)
    w.failed("probe", "connection", down)
    assert str(w.health) == "unreachable (connection, 1/3 primaries)"
    assert w.cooling


def one_full_primary(clock: FakeClock, metrics: Metrics) -> StoreWatch:
    """A cluster's watch after a probe that one of three primaries refused (full)."""
    w = watch(clock, metrics, one_server=False)
    w.probing()
    w.failed("probe", "oom", ProbeFailed("1/3 primaries", ["127.0.0.1:7002"], 3))
    return w


def test_a_probes_count_of_primaries_is_not_shown_with_another_cause(
    clock: FakeClock, metrics: Metrics
) -> None:
    w = one_full_primary(clock, metrics)
    w.failed("save", "oom", StoreError("full"))  # the same fault, met by a call
    assert str(w.health) == "degraded (oom, 1/3 primaries)"
    w.failed("load", "timeout", StoreError("timed out"))  # not what the probe counted
    assert str(w.health) == "unreachable (timeout)"


def test_a_probe_taken_before_the_failure_settles_keeps_its_count_of_primaries(
    clock: FakeClock, metrics: Metrics
) -> None:
    w = one_full_primary(clock, metrics)
    clock.advance(SETTLE_S / 2)
    w.probing()
    w.wrote("probe")  # memory freed for an instant: not settled
    assert str(w.health) == "degraded (oom, 1/3 primaries)"
    clock.advance(SETTLE_S)
    w.probing()
    w.wrote("probe")
    assert w.health == Health()


async def test_on_a_cluster_a_write_performed_while_failing_starts_a_probe(
    clock: FakeClock, metrics: Metrics
) -> None:
    """No /readyz polling needed: the store finds its way back with traffic alone."""
    remote = RefusingStore(clock, one_server=False)
    store = ResilientStore(remote, MemoryStore(ttl_s=3600, clock=clock), metrics, clock=clock)
    try:
        remote.refusal = OOM
        await store.note_seen(KEY, Sighting(1, 10, "m", 0.0))
        remote.refusal = None
        await store.note_seen(KEY, Sighting(2, 10, "m", 0.0))
        clock.advance(SETTLE_S)
        await store.note_seen(KEY, Sighting(3, 10, "m", 0.0))
        for _ in range(10):
            await asyncio.sleep(0)
        assert remote.calls["probe"] == 1
        assert value(metrics, "store_degraded") == 0
        assert str(await store.health()) == "ok"
    finally:
        await store.aclose()


async def test_a_background_probe_that_raises_a_bug_logs_it(
    clock: FakeClock, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    """Not the store's answer: no task is left holding an exception no one reads."""

    class Broken(RefusingStore):
        async def probe(self) -> None:
            self.calls["probe"] += 1
            raise RuntimeError("a bug in the probe")

    remote = Broken(clock, one_server=False)
    store = ResilientStore(remote, MemoryStore(ttl_s=3600, clock=clock), metrics, clock=clock)
    try:
        with caplog.at_level(logging.ERROR, "proxy.store"):
            remote.refusal = OOM
            await store.note_seen(KEY, Sighting(1, 10, "m", 0.0))
            remote.refusal = None
            clock.advance(SETTLE_S)
            await store.note_seen(KEY, Sighting(2, 10, "m", 0.0))  # starts the probe
            for _ in range(10):
                await asyncio.sleep(0)
        assert remote.calls["probe"] == 1
        [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], RuntimeError)
    finally:
        await store.aclose()


def test_the_cool_down_is_jittered_between_half_of_cooldown_s_and_all_of_it(
    clock: FakeClock, metrics: Metrics
) -> None:
    draws = [jittered_cooldown() for _ in range(200)]
    assert min(draws) > COOLDOWN_S / 2
    assert max(draws) <= COOLDOWN_S
    assert max(draws) - min(draws) > COOLDOWN_S / 4, "replicas do not reconnect at once"
    w = StoreWatch(metrics.store, clock, cooldown=lambda: 1.3)
    w.failed("load", "timeout", StoreError("timed out"))
    clock.advance(1.29)
    assert w.cooling
    clock.advance(0.01)
    assert not w.cooling


async def test_while_failing_what_the_store_took_is_kept_here_for_the_next_cool_down(
    store: ResilientStore, remote: RefusingStore, clock: FakeClock
) -> None:
    """A cluster with a primary down: other primaries take writes between cool-downs; in
    the next one the session goes on from its newest snapshot, not from an older one."""
    remote.refusal = OOM
    await store.note_seen(KEY, Sighting(1, 10, "m", 0.0))  # failing
    remote.refusal = None
    assert await store.save(KEY, snap(1, "taken"))  # written there, failing still
    assert str(store._watch.health) == "degraded (oom)"
    remote.refusal, remote.reads_refused = REFUSED, True
    assert await store.load_window("up|m") is None  # the cool-down starts
    assert store.degraded
    loaded = await store.load(KEY)
    assert loaded is not None
    assert (loaded.version, loaded.summary) == (1, "taken")
