"""The ``ItemStore`` contract (issue 24: the output items ``item_reference`` inputs name),
run against the embedded store, Redis (a real redis-server) and the resilient pair
``build_item_store`` makes of a ``redis://`` URL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson
import pytest
import redis.asyncio as aioredis

from proxy.observe.metrics import Metrics
from proxy.store import ItemStore, build_item_store
from proxy.store.fallbacks import ResilientItems
from proxy.store.items import MAX_ITEM_BYTES, MemoryItems
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.redis_items import RedisItems, item_keys
from proxy.store.resilient import ResilientStore
from tests.support.servers import RedisServer, proxy_settings

KINDS = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("resilient", marks=pytest.mark.redis),
]


def item(n: int, text: str = "an answer") -> tuple[str, bytes]:
    body = {"type": "message", "id": f"msg_{n}", "role": "assistant", "content": text}
    return f"msg_{n}", orjson.dumps(body)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Items:
    make: Callable[[float, int], Awaitable[ItemStore]]  # (ttl_s, per tenant)
    elapse: Callable[[float], Awaitable[None]]


@pytest.fixture(params=KINDS)
async def items(request: pytest.FixtureRequest) -> AsyncIterator[Items]:
    clock = Clock()
    opened: list[RedisStore] = []

    async def make(ttl_s: float, per_tenant: int) -> ItemStore:
        if request.param == "memory":
            return MemoryItems(ttl_s, per_tenant=per_tenant, clock=clock)
        server = request.getfixturevalue("redis_server")
        remote = RedisStore(server.url, ttl_s)
        opened.append(remote)
        redis_items = RedisItems(remote.client, "cp", ttl_s)
        redis_items.per_tenant = per_tenant
        if request.param == "redis":
            return redis_items
        store = ResilientStore(remote, MemoryStore(ttl_s), Metrics.create())
        return ResilientItems(store, redis_items, MemoryItems(ttl_s, per_tenant=per_tenant))

    async def elapse(seconds: float) -> None:
        clock.now += seconds
        if request.param != "memory":
            await asyncio.sleep(seconds)

    yield Items(make, elapse)
    for store in opened:
        await store.aclose()


async def test_items_are_recalled_by_id_in_order_and_per_tenant(items: Items) -> None:
    store = await items.make(3600, 100)
    await store.remember_items("tenant-a", [item(1, "one"), item(2, "two")])
    recalled = await store.recall_items("tenant-a", ["msg_2", "msg_nope", "msg_1"])
    assert recalled == [item(2, "two")[1], None, item(1, "one")[1]]
    assert await store.recall_items("tenant-b", ["msg_1"]) == [None]
    assert await store.recall_items("tenant-a", []) == []


async def test_an_item_too_big_or_with_a_long_id_is_not_kept(items: Items) -> None:
    store = await items.make(3600, 100)
    big = ("msg_big", b'{"text": "' + b"x" * MAX_ITEM_BYTES + b'"}')
    await store.remember_items("t", [big, ("m" * 129, b"{}"), item(1)])
    assert await store.recall_items("t", ["msg_big", "m" * 129, "msg_1"]) == [
        None,
        None,
        item(1)[1],
    ]


async def test_a_tenant_keeps_its_newest_items_up_to_its_bound(items: Items) -> None:
    store = await items.make(3600, 3)
    for n in range(5):
        await store.remember_items("t", [item(n)])
        await items.elapse(0.002)  # distinct write times for Redis's index
    await store.remember_items("other", [item(9)])
    kept = await store.recall_items("t", [f"msg_{n}" for n in range(5)])
    assert [r is not None for r in kept] == [False, False, True, True, True]
    assert await store.recall_items("other", ["msg_9"]) == [item(9)[1]]


async def test_items_expire_with_the_store_ttl(items: Items) -> None:
    store = await items.make(0.05, 100)
    await store.remember_items("t", [item(1)])
    await items.elapse(0.2)
    assert await store.recall_items("t", ["msg_1"]) == [None]


async def test_the_embedded_store_is_bounded_in_bytes() -> None:
    store = MemoryItems(3600, max_bytes=3 * len(item(0)[1]))
    await store.remember_items("a", [item(0), item(1)])
    await store.remember_items("b", [item(2), item(3)])
    assert await store.recall_items("a", ["msg_0", "msg_1"]) == [None, item(1)[1]]
    assert await store.recall_items("b", ["msg_2", "msg_3"]) == [item(2)[1], item(3)[1]]


@pytest.mark.redis
async def test_redis_keys_sit_under_the_store_prefix(redis_server: RedisServer) -> None:
    url = redis_server.url
    remote = RedisStore(url, 3600)
    try:
        store = RedisItems(remote.client, "pfx", 3600)
        await store.remember_items("tenant-a", [item(1)])
        raw = aioredis.Redis.from_url(url)
        index, keys = item_keys("pfx", "tenant-a", ["msg_1"])
        assert (index, keys) == ("pfx:items:tenant-a", ["pfx:item:tenant-a:msg_1"])
        assert await raw.get(keys[0]) == item(1)[1]
        assert await raw.zrange(index, 0, -1) == [b"msg_1"]
        assert 0 < await raw.pttl(keys[0]) <= 3_600_000
        await raw.aclose()
    finally:
        await remote.aclose()


@pytest.mark.redis
async def test_build_item_store_keeps_items_in_redis_and_falls_back_when_it_is_out(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url
    settings = proxy_settings("http://127.0.0.1:1", store={"url": url})
    metrics = Metrics.create()
    from proxy.store import build_store

    store = build_store(settings, metrics)
    built = build_item_store(settings, store)
    assert isinstance(built, ResilientItems)
    await built.remember_items("t", [item(1)])
    assert await built.remote.recall_items("t", ["msg_1"]) == [item(1)[1]]
    await store.aclose()
    down = build_store(
        proxy_settings("http://127.0.0.1:1", store={"url": "redis://127.0.0.1:1"}), metrics
    )
    fallback = build_item_store(settings, down)
    await fallback.remember_items("t", [item(2)])  # Redis refuses: kept in this process
    assert await fallback.recall_items("t", ["msg_2"]) == [item(2)[1]]
    errors = metrics.store.errors.labels(operation="remember_items")._value.get()
    assert errors == 1
    await down.aclose()
    assert isinstance(
        build_item_store(proxy_settings("http://127.0.0.1:1"), MemoryStore(60)), MemoryItems
    )


async def test_an_item_read_is_kept_longer_and_evicted_last(items: Items) -> None:
    """Refreshed on use, as snapshots are: a live conversation's answers stay."""
    store = await items.make(1.0, 2)
    await store.remember_items("t", [item(1)])
    await items.elapse(0.05)
    await store.remember_items("t", [item(2)])
    await items.elapse(0.6)
    assert await store.recall_items("t", ["msg_1"]) == [item(1)[1]]
    await items.elapse(0.05)
    await store.remember_items("t", [item(3)])  # past the bound: msg_2 is the least used
    await items.elapse(0.5)  # msg_1 lives 1 s from its read, not from its write
    assert await store.recall_items("t", ["msg_1", "msg_2", "msg_3"]) == [
        item(1)[1],
        None,
        item(3)[1],
    ]
