"""The SnapshotStore contract, run against every store implementation.

Add a store by adding its name to ``STORES`` and a branch to ``store_factory``
(a Redis run should carry the ``redis`` marker and skip when no server is set).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.metrics import Metrics
from proxy.store import Snapshot, SnapshotStore
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.resilient import ResilientStore

STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("resilient", marks=pytest.mark.redis),
]
LONG_TTL = 3600.0
SHORT_TTL = 0.05
KEY = "tenant-a:h:session-1"

Factory = Callable[[float], Awaitable[SnapshotStore]]


@pytest.fixture(params=STORES)
async def store_factory(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """Builds fresh stores of one kind with a given TTL; closes them all afterwards."""
    made: list[SnapshotStore] = []

    async def make(ttl_s: float) -> SnapshotStore:
        if request.param == "memory":
            store: SnapshotStore = MemoryStore(ttl_s=ttl_s)
        elif request.param == "redis":
            server = request.getfixturevalue("redis_server")
            # Redis TTLs are whole milliseconds at least; the contract's shortest is 50 ms.
            store = RedisStore(server.url, ttl_s=ttl_s)
        elif request.param == "resilient":
            # What build_store makes of a redis:// URL: Redis, with local state behind it.
            server = request.getfixturevalue("redis_server")
            remote = RedisStore(server.url, ttl_s=ttl_s)
            store = ResilientStore(remote, MemoryStore(ttl_s=ttl_s), Metrics.create())
        else:  # pragma: no cover - a new store kind must be wired up here
            raise AssertionError(f"unknown store kind {request.param}")
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()


@pytest.fixture
async def store(store_factory: Factory) -> SnapshotStore:
    return await store_factory(LONG_TTL)


def snap(version: int, summary: str = "") -> Snapshot:
    return Snapshot(
        version=version,
        summary=summary or f"summary v{version}",
        pinned=1,
        covered=10 * version,
        elide_before=1,
        anchor_hash=f"hash-{version}",
        summary_tokens=50,
        tokens_before=4000,
        tokens_after=2000,
        created_at=1_700_000_000.0,
        updated_at=1_700_000_000.0 + version,
        model="gpt-4o",
    )


async def test_missing_key_loads_none(store: SnapshotStore) -> None:
    assert await store.load("never-written") is None


async def test_first_version_saves_over_nothing_and_loads_back(store: SnapshotStore) -> None:
    written = snap(1, "the user wants a CSV export")
    assert await store.save(KEY, written) is True
    assert await store.load(KEY) == written


async def test_first_save_must_be_version_one(store: SnapshotStore) -> None:
    assert await store.save(KEY, snap(2)) is False
    assert await store.load(KEY) is None


async def test_next_version_replaces_the_previous(store: SnapshotStore) -> None:
    assert await store.save(KEY, snap(1))
    assert await store.save(KEY, snap(2, "newer"))
    loaded = await store.load(KEY)
    assert loaded is not None
    assert (loaded.version, loaded.summary) == (2, "newer")


async def test_skipping_a_version_is_refused(store: SnapshotStore) -> None:
    assert await store.save(KEY, snap(1, "original"))
    assert await store.save(KEY, snap(3)) is False
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "original"


async def test_a_second_writer_of_the_same_version_loses(store: SnapshotStore) -> None:
    assert await store.save(KEY, snap(1, "first writer"))
    assert await store.save(KEY, snap(1, "second writer")) is False
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "first writer"


async def test_a_stale_writer_never_overwrites_a_newer_snapshot(store: SnapshotStore) -> None:
    assert await store.save(KEY, snap(1))
    assert await store.save(KEY, snap(2))
    assert await store.save(KEY, snap(3, "newest"))
    for stale in (1, 2, 3):
        assert await store.save(KEY, snap(stale, "stale")) is False
    loaded = await store.load(KEY)
    assert loaded is not None
    assert (loaded.version, loaded.summary) == (3, "newest")


async def test_concurrent_writers_of_the_same_version_exactly_one_wins(
    store: SnapshotStore,
) -> None:
    assert await store.save(KEY, snap(1))
    results = await asyncio.gather(*(store.save(KEY, snap(2, f"writer {i}")) for i in range(10)))
    assert sorted(results) == [False] * 9 + [True]
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == f"writer {results.index(True)}"


async def test_keys_are_independent(store: SnapshotStore) -> None:
    assert await store.save("tenant-a:h:s", snap(1, "a"))
    assert await store.save("tenant-b:h:s", snap(1, "b"))
    assert await store.save("tenant-a:h:s", snap(2, "a2"))
    b = await store.load("tenant-b:h:s")
    assert b is not None
    assert (b.version, b.summary) == (1, "b")


async def test_delete_removes_and_reports_whether_anything_was_there(store: SnapshotStore) -> None:
    assert await store.save(KEY, snap(1))
    assert await store.delete(KEY) is True
    assert await store.load(KEY) is None
    assert await store.delete(KEY) is False
    assert await store.save(KEY, snap(1, "fresh start")), "after delete, version 1 starts over"


async def test_snapshots_expire_after_the_ttl(store_factory: Factory) -> None:
    store = await store_factory(SHORT_TTL)
    assert await store.save(KEY, snap(1))
    assert await store.load(KEY) is not None
    await asyncio.sleep(SHORT_TTL * 3)
    assert await store.load(KEY) is None
    assert await store.save(KEY, snap(1, "after expiry")), "an expired key counts as empty"


async def test_lock_is_exclusive_until_released_by_its_owner(store: SnapshotStore) -> None:
    owner = await store.acquire(KEY, LONG_TTL)
    assert isinstance(owner, str)
    assert owner
    assert await store.acquire(KEY, LONG_TTL) is None

    await store.release(KEY, "not-the-owner-token")
    assert await store.acquire(KEY, LONG_TTL) is None, "a wrong token must not release"

    await store.release(KEY, owner)
    again = await store.acquire(KEY, LONG_TTL)
    assert again is not None
    assert again != owner, "each acquisition gets its own token"


async def test_locks_are_per_key(store: SnapshotStore) -> None:
    assert await store.acquire("tenant-a:h:one", LONG_TTL) is not None
    assert await store.acquire("tenant-a:h:two", LONG_TTL) is not None


async def test_concurrent_acquirers_exactly_one_wins(store: SnapshotStore) -> None:
    tokens = await asyncio.gather(*(store.acquire(KEY, LONG_TTL) for _ in range(10)))
    assert sum(t is not None for t in tokens) == 1


async def test_expired_lock_can_be_reacquired_and_the_old_owner_cannot_release_it(
    store: SnapshotStore,
) -> None:
    first = await store.acquire(KEY, SHORT_TTL)
    assert first is not None
    await asyncio.sleep(SHORT_TTL * 3)
    second = await store.acquire(KEY, LONG_TTL)
    assert second is not None
    assert second != first
    await store.release(KEY, first)  # the slow first owner finishes late
    assert await store.acquire(KEY, LONG_TTL) is None, "the new owner's lock must survive"


async def test_locks_and_snapshots_do_not_interfere(store: SnapshotStore) -> None:
    token = await store.acquire(KEY, LONG_TTL)
    assert token is not None
    assert await store.load(KEY) is None
    assert await store.save(KEY, snap(1))
    assert await store.delete(KEY)
    assert await store.acquire(KEY, LONG_TTL) is None, "deleting the snapshot keeps the lock"
    await store.release(KEY, token)


async def test_ping(store: SnapshotStore) -> None:
    assert await store.ping() is True


async def test_list_sessions_returns_stored_snapshots_up_to_the_limit(store: SnapshotStore) -> None:
    for i in range(3):
        assert await store.save(f"tenant:h:s{i}", snap(1, f"summary {i}"))
    assert await store.save("tenant:h:s0", snap(2, "summary 0 v2"))
    everything = dict(await store.list_sessions(10))
    assert set(everything) == {"tenant:h:s0", "tenant:h:s1", "tenant:h:s2"}
    assert everything["tenant:h:s0"].version == 2
    assert everything["tenant:h:s1"].summary == "summary 1"
    assert len(await store.list_sessions(2)) == 2


async def test_list_sessions_skips_expired_snapshots(store_factory: Factory) -> None:
    store = await store_factory(SHORT_TTL)
    assert await store.save("tenant:h:gone", snap(1))
    await asyncio.sleep(SHORT_TTL * 3)
    assert await store.list_sessions(10) == []


# MemoryStore only: what keeps the embedded store's memory bounded.


async def test_memory_store_drops_expired_entries_as_it_goes() -> None:
    """Expired sessions, locks and windows go on the next write, read or not."""
    store = MemoryStore(ttl_s=SHORT_TTL)
    for i in range(50):
        assert await store.save(f"tenant:h:s{i}", snap(1))
        assert await store.acquire(f"tenant:h:s{i}", SHORT_TTL) is not None
        await store.save_window(f"tenant:m{i}", 1000, SHORT_TTL)
    await asyncio.sleep(SHORT_TTL * 3)
    assert await store.save("tenant:h:new", snap(1))
    assert await store.acquire("tenant:h:new", LONG_TTL) is not None
    await store.save_window("tenant:m-new", 1000, LONG_TTL)
    # Private state on purpose: what is held, not what load() is willing to return.
    assert list(store._data) == ["tenant:h:new"]
    assert list(store._locks) == ["tenant:h:new"]
    assert list(store._windows) == ["tenant:m-new"]


async def test_memory_store_keeps_the_most_recently_used_sessions() -> None:
    store = MemoryStore(ttl_s=LONG_TTL, max_sessions=2)
    assert await store.save("a", snap(1))
    assert await store.save("b", snap(1))
    assert await store.load("a") is not None  # a is now the most recently used
    assert await store.save("c", snap(1))
    assert await store.load("b") is None
    assert await store.load("a") is not None
    assert await store.load("c") is not None


async def test_build_store_honours_store_max_sessions() -> None:
    from proxy.config import Settings
    from proxy.metrics import Metrics
    from proxy.store import build_store

    store = build_store(Settings(store={"max_sessions": 2}), Metrics.create())
    for name in ("a", "b", "c"):
        assert await store.save(name, snap(1))
    assert {key for key, _ in await store.list_sessions(10)} == {"b", "c"}
    await store.aclose()
