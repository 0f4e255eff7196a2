"""The store contract, run against every store implementation.

Add a store by adding its name to ``STORES`` and a branch to ``stores``
(a Redis run should carry the ``redis`` marker and skip when no server is set).
Time is a fake clock for the memory store; Redis expires keys itself, so its
runs wait the (short) TTLs out for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import pytest

from proxy.core.session import SessionKey
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Sighting, Snapshot, Store
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisOptions, RedisStore
from proxy.store.resilient import ResilientStore
from tests.support.snapshots import snap

STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("resilient", marks=pytest.mark.redis),
    pytest.param("cluster", marks=pytest.mark.redis),
    pytest.param("sentinel", marks=pytest.mark.redis),
    pytest.param("valkey", marks=pytest.mark.redis),
]
LONG_TTL = 3600.0
# The contract is what a call does, not how fast: 2 s a call, not the product's 0.25 s
# (tests/e2e/test_redis_faults.py holds that), which ten first connections at once
# overran on a loaded CI machine (test_concurrent_acquirers_exactly_one_wins, Valkey).
CALLS = RedisOptions(timeout_s=2.0)
SHORT_TTL = 0.05


def key(session: str, tenant: str = "tenant-a") -> SessionKey:
    return SessionKey(tenant, session, "header")


KEY = key("session-1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Stores:
    """Makes fresh stores of one kind with a given TTL, and lets time pass for them."""

    make: Callable[[float], Awaitable[Store]]
    elapse: Callable[[float], Awaitable[None]]


@pytest.fixture(params=STORES)
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    made: list[Store] = []
    clock = FakeClock()

    async def make(ttl_s: float) -> Store:
        store: Store
        if request.param == "memory":
            store = MemoryStore(ttl_s=ttl_s, clock=clock)
        elif request.param == "redis":
            server = request.getfixturevalue("redis_server")
            # Redis TTLs are whole milliseconds at least; the contract's shortest is 50 ms.
            store = RedisStore(server.url, ttl_s=ttl_s, options=CALLS)
        elif request.param == "resilient":
            # What build_store makes of a redis:// URL: Redis, with local state behind it.
            server = request.getfixturevalue("redis_server")
            remote = RedisStore(server.url, ttl_s=ttl_s, options=CALLS)
            store = ResilientStore(remote, MemoryStore(ttl_s=ttl_s), Metrics.create())
        elif request.param == "cluster":
            # A 3-primary Redis Cluster: a session's keys on one node, sessions on all.
            cluster = request.getfixturevalue("redis_cluster")
            store = RedisStore(cluster.url, ttl_s=ttl_s, options=CALLS)
        elif request.param == "sentinel":
            # A primary found through three sentinels (redis+sentinel://, two passwords).
            group = request.getfixturevalue("sentinel_shared")
            store = RedisStore(group.url, ttl_s=ttl_s, options=CALLS)
        elif request.param == "valkey":
            server = request.getfixturevalue("valkey_server")
            store = RedisStore(server.url, ttl_s=ttl_s, options=CALLS)
        else:  # pragma: no cover - a new store kind must be wired up here
            raise AssertionError(f"unknown store kind {request.param}")
        made.append(store)
        return store

    async def elapse(seconds: float) -> None:
        if request.param == "memory":
            clock.now += seconds
        else:
            await asyncio.sleep(seconds)  # Redis expires keys by its own clock

    yield Stores(make, elapse)
    for store in made:
        await store.aclose()


@pytest.fixture
async def store(stores: Stores) -> Store:
    return await stores.make(LONG_TTL)


async def test_missing_key_loads_none(store: Store) -> None:
    assert await store.load(key("never-written")) is None


async def test_first_version_saves_over_nothing_and_loads_back(store: Store) -> None:
    written = snap(1, "the user wants a CSV export")
    assert await store.save(KEY, written) is True
    assert await store.load(KEY) == written


async def test_first_save_must_be_version_one(store: Store) -> None:
    assert await store.save(KEY, snap(2)) is False
    assert await store.load(KEY) is None


async def test_next_version_replaces_the_previous(store: Store) -> None:
    assert await store.save(KEY, snap(1))
    assert await store.save(KEY, snap(2, "newer"))
    loaded = await store.load(KEY)
    assert loaded is not None
    assert (loaded.version, loaded.summary) == (2, "newer")


async def test_skipping_a_version_is_refused(store: Store) -> None:
    assert await store.save(KEY, snap(1, "original"))
    assert await store.save(KEY, snap(3)) is False
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "original"


async def test_a_second_writer_of_the_same_version_loses(store: Store) -> None:
    assert await store.save(KEY, snap(1, "first writer"))
    assert await store.save(KEY, snap(1, "second writer")) is False
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "first writer"


async def test_a_stale_writer_never_overwrites_a_newer_snapshot(store: Store) -> None:
    assert await store.save(KEY, snap(1))
    assert await store.save(KEY, snap(2))
    assert await store.save(KEY, snap(3, "newest"))
    for stale in (1, 2, 3):
        assert await store.save(KEY, snap(stale, "stale")) is False
    loaded = await store.load(KEY)
    assert loaded is not None
    assert (loaded.version, loaded.summary) == (3, "newest")


async def test_concurrent_writers_of_the_same_version_exactly_one_wins(
    store: Store,
) -> None:
    assert await store.save(KEY, snap(1))
    results = await asyncio.gather(*(store.save(KEY, snap(2, f"writer {i}")) for i in range(10)))
    assert sorted(results) == [False] * 9 + [True]
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == f"writer {results.index(True)}"


async def test_keys_are_independent(store: Store) -> None:
    a, b_key = key("s", "tenant-a"), key("s", "tenant-b")
    derived = SessionKey("tenant-a", "s", "derived")
    assert await store.save(a, snap(1, "a"))
    assert await store.save(b_key, snap(1, "b"))
    assert await store.save(a, snap(2, "a2"))
    assert await store.save(derived, snap(1, "derived")), "header and derived never collide"
    b = await store.load(b_key)
    assert b is not None
    assert (b.version, b.summary) == (1, "b")


async def test_shadow_snapshots_and_locks_are_kept_apart_and_never_listed(store: Store) -> None:
    """Shadow mode's snapshots (compaction/shadow.py) under a session's shadow key: never
    the live one's, nor listed with the sessions (``cp:shadow-snap:`` in Redis)."""
    shadow = replace(KEY, shadow=True)
    assert await store.save(shadow, snap(1, "shadow"))
    assert await store.load(KEY) is None
    assert await store.save(KEY, snap(1, "live"))
    assert [s and s.summary for s in await store.load_many([KEY, shadow])] == ["live", "shadow"]
    assert [k for k, _ in await store.list_sessions(10)] == [KEY]
    assert await store.acquire(shadow, LONG_TTL) is not None
    assert await store.acquire(KEY, LONG_TTL) is not None, "locks apart too"
    assert await store.delete(shadow) is True
    assert (await store.load(KEY) or snap(0)).summary == "live"


async def test_load_many_loads_each_key_in_order(store: Store) -> None:
    """A session's slots in one call (one Redis round trip): each as ``load`` has it."""
    keys = [key("slot"), key("slot-1"), key("slot-2"), key("slot", "tenant-b")]
    assert await store.save(keys[0], snap(1, "first"))
    assert await store.save(keys[2], snap(1, "third"))
    assert await store.load_many(keys) == [await store.load(k) for k in keys]
    assert [s and s.summary for s in await store.load_many(keys)] == ["first", None, "third", None]
    assert await store.load_many([]) == []


async def test_delete_removes_and_reports_whether_anything_was_there(store: Store) -> None:
    assert await store.save(KEY, snap(1))
    assert await store.delete(KEY) is True
    assert await store.load(KEY) is None
    assert await store.delete(KEY) is False
    assert await store.save(KEY, snap(1, "fresh start")), "after delete, version 1 starts over"


async def test_snapshots_expire_after_the_ttl(stores: Stores) -> None:
    store = await stores.make(SHORT_TTL)
    assert await store.save(KEY, snap(1))
    assert await store.load(KEY) is not None
    await stores.elapse(SHORT_TTL * 3)
    assert await store.load(KEY) is None
    assert await store.save(KEY, snap(1, "after expiry")), "an expired key counts as empty"


async def test_lock_is_exclusive_until_released_by_its_owner(store: Store) -> None:
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


async def test_locks_are_per_key(store: Store) -> None:
    assert await store.acquire(key("one"), LONG_TTL) is not None
    assert await store.acquire(key("two"), LONG_TTL) is not None


async def test_concurrent_acquirers_exactly_one_wins(store: Store) -> None:
    tokens = await asyncio.gather(*(store.acquire(KEY, LONG_TTL) for _ in range(10)))
    assert sum(t is not None for t in tokens) == 1


async def test_expired_lock_can_be_reacquired_and_the_old_owner_cannot_release_it(
    store: Store, stores: Stores
) -> None:
    first = await store.acquire(KEY, SHORT_TTL)
    assert first is not None
    await stores.elapse(SHORT_TTL * 3)
    second = await store.acquire(KEY, LONG_TTL)
    assert second is not None
    assert second != first
    await store.release(KEY, first)  # the slow first owner finishes late
    assert await store.acquire(KEY, LONG_TTL) is None, "the new owner's lock must survive"


async def test_locks_and_snapshots_do_not_interfere(store: Store) -> None:
    token = await store.acquire(KEY, LONG_TTL)
    assert token is not None
    assert await store.load(KEY) is None
    assert await store.save(KEY, snap(1))
    assert await store.delete(KEY)
    assert await store.acquire(KEY, LONG_TTL) is None, "deleting the snapshot keeps the lock"
    await store.release(KEY, token)


async def test_ping(store: Store) -> None:
    assert await store.ping() is True


async def test_list_sessions_returns_stored_snapshots_up_to_the_limit(store: Store) -> None:
    for i in range(3):
        assert await store.save(key(f"s{i}"), snap(1, f"summary {i}"))
    assert await store.save(key("s0"), snap(2, "summary 0 v2"))
    assert await store.save(SessionKey("tenant-b", "s9", "derived"), snap(1, "derived"))
    everything = dict(await store.list_sessions(10))
    assert set(everything) == {
        key("s0"),
        key("s1"),
        key("s2"),
        SessionKey("tenant-b", "s9", "derived"),
    }
    assert everything[key("s0")].version == 2
    assert everything[key("s1")].summary == "summary 1"
    assert len(await store.list_sessions(2)) == 2


async def test_list_sessions_skips_expired_snapshots(stores: Stores) -> None:
    store = await stores.make(SHORT_TTL)
    assert await store.save(key("gone"), snap(1))
    await stores.elapse(SHORT_TTL * 3)
    assert await store.list_sessions(10) == []


async def test_a_missing_window_loads_none(store: Store) -> None:
    assert await store.load_window("upstream|never-learned") is None


async def test_a_saved_window_loads_back_and_a_later_one_replaces_it(store: Store) -> None:
    await store.save_window("upstream|model-a", 8000, LONG_TTL)
    await store.save_window("upstream|model-b", 16000, LONG_TTL)
    assert await store.load_window("upstream|model-a") == 8000
    await store.save_window("upstream|model-a", 6000, LONG_TTL)
    assert await store.load_window("upstream|model-a") == 6000
    assert await store.load_window("upstream|model-b") == 16000


async def test_windows_expire_after_their_own_ttl(store: Store, stores: Stores) -> None:
    await store.save_window("upstream|short", 8000, SHORT_TTL)
    await store.save_window("upstream|long", 9000, LONG_TTL)
    assert await store.load_window("upstream|short") == 8000
    await stores.elapse(SHORT_TTL * 3)
    assert await store.load_window("upstream|short") is None
    assert await store.load_window("upstream|long") == 9000


async def test_windows_and_sessions_do_not_interfere(store: Store) -> None:
    await store.save_window(KEY.storage_key, 8000, LONG_TTL)
    assert await store.load(KEY) is None
    assert await store.save(KEY, snap(1))
    assert await store.delete(KEY)
    assert await store.load_window(KEY.storage_key) == 8000


# MemoryStore only: what keeps the embedded store's memory bounded.


SEEN = Sighting(messages=3, tokens=120, model="gpt-4o", seen_at=1_700_000_000.5)


async def test_a_session_never_seen_loads_no_sighting(store: Store) -> None:
    assert await store.load_seen(key("never-seen")) is None


async def test_a_sighting_loads_back_and_a_later_one_replaces_it(store: Store) -> None:
    await store.note_seen(KEY, SEEN)
    assert await store.load_seen(KEY) == SEEN
    later = Sighting(messages=5, tokens=300, model="gpt-4o", seen_at=1_700_000_009.0)
    await store.note_seen(KEY, later)
    assert await store.load_seen(KEY) == later


async def test_sightings_are_per_tenant_and_apart_from_snapshots(store: Store) -> None:
    await store.note_seen(KEY, SEEN)
    assert await store.load_seen(key("session-1", tenant="tenant-b")) is None
    assert await store.load(KEY) is None  # seen is not compacted
    assert await store.save(KEY, snap(1))  # and a sighting never blocks version 1
    assert await store.load_seen(KEY) == SEEN


async def test_delete_forgets_a_session_seen_but_never_compacted(store: Store) -> None:
    await store.note_seen(KEY, SEEN)
    assert await store.delete(KEY) is True
    assert await store.load_seen(KEY) is None
    assert await store.delete(KEY) is False


async def test_sightings_expire_after_the_ttl(stores: Stores) -> None:
    store = await stores.make(SHORT_TTL)
    await store.note_seen(KEY, SEEN)
    await stores.elapse(SHORT_TTL * 3)
    assert await store.load_seen(KEY) is None


async def test_memory_store_drops_expired_entries_as_it_goes() -> None:
    """Expired sessions, locks and windows go on the next write, read or not."""
    clock = FakeClock()
    store = MemoryStore(ttl_s=SHORT_TTL, clock=clock)
    for i in range(50):
        assert await store.save(key(f"s{i}"), snap(1))
        assert await store.acquire(key(f"s{i}"), SHORT_TTL) is not None
        await store.save_window(f"tenant:m{i}", 1000, SHORT_TTL)
    clock.now += SHORT_TTL * 3
    assert await store.save(key("new"), snap(1))
    assert await store.acquire(key("new"), LONG_TTL) is not None
    await store.save_window("tenant:m-new", 1000, LONG_TTL)
    # Private state on purpose: what is held, not what load() is willing to return.
    assert list(store._data) == [key("new")]
    assert list(store._locks) == [key("new")]
    assert list(store._windows) == ["tenant:m-new"]


async def test_memory_store_keeps_the_most_recently_used_sessions() -> None:
    store = MemoryStore(ttl_s=LONG_TTL, max_sessions=2)
    a, b, c = key("a"), key("b"), key("c")
    assert await store.save(a, snap(1))
    assert await store.save(b, snap(1))
    assert await store.load(a) is not None  # a is now the most recently used
    assert await store.save(c, snap(1))
    assert await store.load(b) is None
    assert await store.load(a) is not None
    assert await store.load(c) is not None


async def test_build_store_honours_store_max_sessions() -> None:
    from proxy.config import Settings
    from proxy.observe.metrics import Metrics
    from proxy.store import build_store

    store = build_store(Settings(store={"max_sessions": 2}), Metrics.create())
    for name in ("a", "b", "c"):
        assert await store.save(key(name), snap(1))
    assert {k for k, _ in await store.list_sessions(10)} == {key("b"), key("c")}
    await store.aclose()


async def test_one_tenant_cannot_push_out_another_tenants_sessions() -> None:
    """Past its own cap a tenant's least recently used session goes, not anyone else's."""
    store = MemoryStore(ttl_s=LONG_TTL, max_sessions=4, max_per_tenant=2)
    victim = key("kept", tenant="tenant-b")
    assert await store.save(victim, snap(1))
    flood = [key(f"flood-{i}") for i in range(20)]
    for i, k in enumerate(flood):
        assert await store.save(k, snap(1))
        if i == 10:
            assert await store.load(flood[3]) is None  # long gone
    assert await store.load(victim) is not None
    assert {k for k, _ in await store.list_sessions(10)} == {victim, *flood[-2:]}


async def test_a_tenant_at_its_cap_drops_its_own_least_recently_used() -> None:
    store = MemoryStore(ttl_s=LONG_TTL, max_sessions=100, max_per_tenant=2)
    a, b, c = key("a"), key("b"), key("c")
    assert await store.save(a, snap(1))
    assert await store.save(b, snap(1))
    assert await store.load(a) is not None  # b is now this tenant's least recently used
    assert await store.save(c, snap(1))
    assert await store.load(b) is None
    assert await store.load(a) is not None
    assert await store.save(a, snap(2))  # a new version of a stored session drops nothing
    assert await store.load(c) is not None


async def test_expired_and_deleted_sessions_free_their_tenants_places() -> None:
    clock = FakeClock()
    store = MemoryStore(ttl_s=SHORT_TTL, max_sessions=100, max_per_tenant=2, clock=clock)
    assert await store.save(key("old-1"), snap(1))
    assert await store.save(key("old-2"), snap(1))
    clock.now += SHORT_TTL * 3
    assert await store.save(key("new-1"), snap(1))
    assert await store.save(key("new-2"), snap(1))
    assert await store.delete(key("new-2"))
    assert await store.save(key("new-3"), snap(1))
    assert await store.load(key("new-1")) is not None  # room was made, not taken from it
    assert await store.load(key("new-3")) is not None
    # Private state on purpose: no tenant index outlives its sessions.
    assert list(store._tenants.own) == ["tenant-a"]
    assert list(store._tenants.own["tenant-a"]) == [key("new-1"), key("new-3")]


async def test_one_tenant_cannot_push_out_another_tenants_sightings() -> None:
    """Issue 20 item 11: sightings (what GET /sessions/{id} reads before a first
    compaction) are bounded per tenant like snapshots, not only in all."""
    clock = FakeClock()
    store = MemoryStore(ttl_s=SHORT_TTL, max_sessions=4, max_per_tenant=2, clock=clock)
    victim = key("kept", tenant="tenant-b")
    await store.note_seen(victim, SEEN)
    flood = [key(f"flood-{i}") for i in range(20)]
    for k in flood:
        await store.note_seen(k, SEEN)
    assert await store.load_seen(victim) == SEEN
    assert await store.load_seen(flood[-1]) == SEEN
    assert await store.load_seen(flood[-3]) is None  # the flooder's own oldest went
    assert len(store._seen) == 3
    # Expired and deleted sightings free their tenants' places; no index outlives them.
    assert await store.delete(flood[-1])
    clock.now += SHORT_TTL * 3
    await store.note_seen(key("late"), SEEN)
    assert list(store._seen_tenants.own) == ["tenant-a"]
    assert list(store._seen_tenants.own["tenant-a"]) == [key("late")]


async def test_memory_store_holds_max_sessions_summaries_and_no_more() -> None:
    """The bound docs/security.md states: ``max_sessions`` x (summary + under 1 KB), however
    many sessions come and go."""
    import tracemalloc

    summary_bytes, limit = 16_000, 500
    store = MemoryStore(ttl_s=LONG_TTL, max_sessions=limit, max_per_tenant=limit)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        held = []
        for i in range(4 * limit):
            # Tenant and session ids as the proxy makes them: 32 hex digits each.
            k = key(f"{i:032x}", tenant=f"{i % 40:032x}")
            assert await store.save(k, snap(1, summary=f"{i} " + "x" * summary_bytes))
            if (i + 1) % limit == 0:
                held.append(tracemalloc.get_traced_memory()[0] - base)
    finally:
        tracemalloc.stop()
    assert len(store._data) == limit
    assert max(held) < limit * (summary_bytes + 1024)
    assert held[-1] < held[0] * 1.05  # flat once full


async def test_build_store_honours_store_max_sessions_per_tenant() -> None:
    from proxy.config import Settings
    from proxy.observe.metrics import Metrics
    from proxy.store import build_store

    settings = Settings(store={"max_sessions": 10, "max_sessions_per_tenant": 2})
    store = build_store(settings, Metrics.create())
    for name in ("a", "b", "c"):
        assert await store.save(key(name), snap(1))
    assert await store.save(key("d", tenant="tenant-b"), snap(1))
    held = {k for k, _ in await store.list_sessions(10)}
    assert held == {key("b"), key("c"), key("d", tenant="tenant-b")}
    await store.aclose()


# ResilientStore only: the cool-down after a failure runs on the injected clock.


class _Unreachable(MemoryStore):
    """A remote store whose snapshot reads fail while ``down`` is set."""

    down = True

    async def load(self, key: SessionKey) -> Snapshot | None:
        if self.down:
            raise StoreError("unreachable")
        return await super().load(key)


async def test_resilient_store_serves_local_state_for_the_cooldown_then_tries_again() -> None:
    from proxy.store.resilient import COOLDOWN_S

    clock = FakeClock()
    remote = _Unreachable(ttl_s=LONG_TTL)
    local = MemoryStore(ttl_s=LONG_TTL, clock=clock)
    store = ResilientStore(remote, local, Metrics.create(), clock=clock)
    remote.down = False
    assert await remote.save(KEY, snap(1, "remote"))
    remote.down = True
    assert await local.save(KEY, snap(1, "local"))
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "local"
    assert store.degraded
    remote.down = False
    clock.now += COOLDOWN_S / 2
    assert store.degraded, "no retry of the remote before the cool-down is over"
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "local"
    clock.now += COOLDOWN_S
    assert not store.degraded
    loaded = await store.load(KEY)
    assert loaded is not None
    assert loaded.summary == "remote"
    await store.aclose()
