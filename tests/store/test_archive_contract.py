"""The archive of originals (``store.Archive``, as ``build_archive`` makes it beside the
store), run against every store: memory, Redis standalone, behind ``ResilientStore``, a
Cluster, Sentinel, Valkey. What is archived
loads back verbatim and in order, per tenant, is deleted with the session, expires with
it, and is bounded per session and per tenant, oldest first, each drop reported."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from proxy.core.passages import Original
from proxy.core.session import SessionKey
from proxy.observe.metrics import Metrics
from proxy.store import Dropped, Store, build_archive
from proxy.store.archive import original_bytes
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
# Large enough for the few originals most tests write, small enough to reach.
BOUNDS = (4096, 10_000)


def key(session: str, tenant: str = "tenant-a") -> SessionKey:
    return SessionKey(tenant, session, "header")


def original(position: int, text: str = "", role: str = "user", tool: str = "") -> Original:
    return Original(position, role, text or f"message {position}: budget is 37,500 EUR", tool)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Both:
    """A store and its archive as one object: the snapshot calls the store's, the
    archive's the archive's (``build_archive``; a bare ``RedisStore``'s ``.archive``)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.originals = store.archive if isinstance(store, RedisStore) else build_archive(store)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        return await self.originals.archive(key, originals)

    async def load_archive(self, key: SessionKey) -> list[Original]:
        return await self.originals.load_archive(key)


@dataclass
class Stores:
    make: Callable[[float, tuple[int, int]], Awaitable[Any]]
    elapse: Callable[[float], Awaitable[None]]


@pytest.fixture(params=STORES)
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    made: list[Store] = []
    clock = FakeClock()

    async def make(ttl_s: float, bounds: tuple[int, int] = BOUNDS) -> Any:
        options = RedisOptions(timeout_s=2.0, archive_bounds=bounds)
        store: Store
        kind = request.param
        if kind == "memory":
            store = MemoryStore(ttl_s=ttl_s, clock=clock, archive_bounds=bounds)
        elif kind in ("redis", "resilient"):
            server = request.getfixturevalue("redis_server")
            store = RedisStore(server.url, ttl_s=ttl_s, options=options)
            if kind == "resilient":
                local = MemoryStore(ttl_s=ttl_s, archive_bounds=bounds)
                store = ResilientStore(store, local, Metrics.create())
        elif kind == "cluster":
            cluster = request.getfixturevalue("redis_cluster")
            store = RedisStore(cluster.url, ttl_s=ttl_s, options=options)
        elif kind == "sentinel":
            group = request.getfixturevalue("sentinel_shared")
            store = RedisStore(group.url, ttl_s=ttl_s, options=options)
        else:
            server = request.getfixturevalue("valkey_server")
            store = RedisStore(server.url, ttl_s=ttl_s, options=options)
        made.append(store)
        return Both(store)

    async def elapse(seconds: float) -> None:
        if request.param == "memory":
            clock.now += seconds
        else:
            await asyncio.sleep(seconds)

    yield Stores(make, elapse)
    for store in made:
        await store.aclose()


@pytest.fixture
async def store(stores: Stores) -> Any:
    return await stores.make(LONG_TTL, BOUNDS)


async def test_an_archive_loads_back_verbatim_in_the_order_written(store: Any) -> None:
    first = [original(3, "Ship it to Dana Whitfield on the 14th"), original(4, role="assistant")]
    call = Original(5, "assistant", 'lookup {"city": "Zürich"}')
    result = Original(6, "tool", "temperature: 3 °C\nwind: 12 km/h", "lookup")
    assert await store.load_archive(key("s")) == []
    await store.archive(key("s"), first)
    await store.archive(key("s"), [call, result])
    assert await store.load_archive(key("s")) == [*first, call, result]


async def test_another_tenant_finds_nothing_of_an_archive(store: Any) -> None:
    await store.archive(key("s", "tenant-a"), [original(1, "the vault code is 7731")])
    assert await store.load_archive(key("s", "tenant-b")) == []
    assert await store.load_archive(SessionKey("tenant-a", "s", "derived")) == []


async def test_delete_removes_the_archive_with_the_session(store: Any) -> None:
    await store.save(key("s"), snap(1))
    await store.archive(key("s"), [original(1)])
    await store.archive(key("other"), [original(1)])
    assert await store.delete(key("s"))
    assert await store.load_archive(key("s")) == []
    assert await store.load_archive(key("other")) == [original(1)]


async def test_delete_reports_an_archive_alone(store: Any) -> None:
    await store.archive(key("s"), [original(1)])
    assert await store.delete(key("s"))
    assert not await store.delete(key("s"))


async def test_a_session_over_its_bound_drops_its_oldest_originals(store: Any) -> None:
    text = "x" * 1000
    originals = [original(i, text) for i in range(6)]
    size = original_bytes(originals[0])
    dropped = await store.archive(key("s"), originals[:3])
    assert dropped.session == 0
    dropped = await store.archive(key("s"), originals[3:])
    kept = await store.load_archive(key("s"))
    assert kept == originals[-len(kept) :]  # the newest, in order
    assert 0 < len(kept) < 6
    assert dropped.session > 0
    # Redis counts its entries' bytes, the memory store its estimate: both near a size each.
    assert dropped.session >= (6 - len(kept)) * (size - 100)


async def test_a_tenant_over_its_bound_drops_its_least_recently_archived_sessions(
    store: Any,
) -> None:
    text = "y" * 3000  # one a session (BOUNDS: 4 KiB each, 10 KB a tenant)
    for name in ("one", "two", "three"):
        dropped = await store.archive(key(name), [original(1, text)])
        assert dropped.session == 0
    assert dropped.tenant == 0
    await store.archive(key("other-tenant", "tenant-b"), [original(1, text)])
    dropped = await store.archive(key("four"), [original(1, text)])
    assert dropped.tenant > 0
    assert await store.load_archive(key("one")) == []  # the oldest went
    assert await store.load_archive(key("four")) == [original(1, text)]
    assert await store.load_archive(key("three")) == [original(1, text)]
    # Another tenant's bound is its own.
    assert await store.load_archive(key("other-tenant", "tenant-b")) == [original(1, text)]


async def test_an_archive_expires_with_the_ttl(stores: Stores) -> None:
    store = await stores.make(0.2, BOUNDS)
    await store.archive(key("s"), [original(1)])
    await stores.elapse(0.4)
    assert await store.load_archive(key("s")) == []


@pytest.mark.redis
async def test_a_clusters_archive_shares_its_sessions_slot(redis_cluster: object) -> None:
    """A session's archive and snapshot are one slot: one DEL removes both, on one node."""
    store = RedisStore(redis_cluster.url, ttl_s=LONG_TTL)  # type: ignore[attr-defined]
    try:
        await store.save(key("s"), snap(1))
        await store.archive.archive(key("s"), [original(1)])
        client = store.client
        names = [n async for n in client.scan_iter(match="cp:*")]
        slots = {await client.cluster_keyslot(n) for n in names if b":arch:" in n or b":snap:" in n}
        assert len(names) >= 2
        assert len(slots) == 1
    finally:
        await store.aclose()


def fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


@pytest.mark.redis
async def test_with_encryption_keys_redis_holds_no_plaintext_of_an_archived_message(
    redis_server: object,
) -> None:
    """Every key's raw value is scanned: no archived text, tool name or argument in it."""
    url = redis_server.url  # type: ignore[attr-defined]
    options = RedisOptions(encryption_keys=[fernet_key()])
    store = RedisStore(url, ttl_s=LONG_TTL, options=options)
    secret = "the launch code is Zephyr-4471 and Dana Whitfield approves"
    originals = [original(1, secret), Original(2, "tool", "Zephyr-4471 status green", "vault")]
    raw = redis.Redis.from_url(url)
    try:
        await store.archive.archive(key("s"), originals)
        assert await store.archive.load_archive(key("s")) == originals  # readable with the key
        values: list[bytes] = []
        for name in raw.scan_iter("*"):
            kind = raw.type(name)
            if kind == b"list":
                values += raw.lrange(name, 0, -1)
            elif kind == b"hash":
                values += [v for kv in raw.hgetall(name).items() for v in kv]
            elif kind == b"zset":
                values += [m for m, _ in raw.zrange(name, 0, -1, withscores=True)]
            elif kind == b"string":
                values.append(raw.get(name))
        assert any(v.startswith(b"gAAAA") for v in values)  # Fernet tokens
        for needle in (b"Zephyr", b"Whitfield", b"vault", b"launch"):
            assert not any(needle in v for v in values), needle
    finally:
        raw.close()
        await store.aclose()


@pytest.mark.redis
async def test_a_long_archive_is_decrypted_off_the_event_loop(
    redis_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decrypting megabytes of originals would stall every request on the loop."""
    import threading

    import proxy.store.redis_archive as module

    threads: set[str] = set()
    decode = module.decode_original

    def recorded(raw: bytes, cipher: Any) -> Original | None:
        threads.add(threading.current_thread().name)
        return decode(raw, cipher)

    monkeypatch.setattr(module, "decode_original", recorded)
    options = RedisOptions(encryption_keys=[fernet_key()])
    store = RedisStore(redis_server.url, ttl_s=LONG_TTL, options=options)  # type: ignore[attr-defined]
    try:
        originals = [original(i, f"message {i}") for i in range(40)]
        await store.archive.archive(key("long"), originals)
        assert await store.archive.load_archive(key("long")) == originals
        assert threading.main_thread().name not in threads, threads
        threads.clear()
        await store.archive.archive(key("short"), originals[:2])
        assert await store.archive.load_archive(key("short")) == originals[:2]
        assert threads == {threading.main_thread().name}  # a few: inline, no thread hop
    finally:
        await store.aclose()
