"""Redis faults a session must survive: a stall that eats a lock release, and
stored values this release cannot read. Real redis-server, real proxies under
uvicorn, the project's simulator as the upstream."""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis

from proxy.core.session import SessionKey, session_from_header, tenant_from_headers
from proxy.observe.metrics import Metrics
from proxy.store import Snapshot
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisOptions, RedisStore
from proxy.store.resilient import ResilientStore
from tests.support.chat import FILLER, WINDOW
from tests.support.servers import RedisServer, proxy_settings, run_server
from tests.support.timing import slack_s

pytestmark = pytest.mark.redis

API_KEY = "sk-tenant-a"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Far below the 30 s default, yet far above what a turn without waiting takes.
WAIT_FOR_SUMMARY_S = 8.0
FAST_TURN_S = 3.0  # on an idle machine; more on a busy one, below the wait (fast_turn_s)


def fast_turn_s(url: str) -> float:
    """The longest a turn that waits for no lock may take now: FAST_TURN_S and the slack
    a busy machine needs (tests.support.timing), short of WAIT_FOR_SUMMARY_S."""
    return min(slack_s(url, FAST_TURN_S), WAIT_FOR_SUMMARY_S - 1.5)


def key(name: str) -> SessionKey:
    """A session key whose Redis names are ``cp:{snap|lock}:tenant:h:{name}``."""
    return SessionKey("tenant", name, "header")


def settings(sim: str, redis_url: str, **store: Any) -> Any:
    return proxy_settings(
        sim,
        store={"url": redis_url, **store},
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "wait_for_summary_s": WAIT_FOR_SUMMARY_S},
    )


def long_history(label: str) -> list[dict[str, Any]]:
    """A conversation over the 4k window's trigger: its next turn compacts."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(40):
        history.append({"role": "user", "content": f"{label} turn {turn}: {FILLER}"})
        history.append({"role": "assistant", "content": f"ok {turn}"})
    history.append({"role": "user", "content": f"{label}: and now?"})
    return history


def next_turn(history: list[dict[str, Any]], n: object) -> None:
    history.append({"role": "assistant", "content": f"noted {n}"})
    history.append({"role": "user", "content": f"follow-up {n}"})


def chat(url: str, session: str, history: list[dict[str, Any]]) -> httpx.Response:
    """One streamed turn (the simulator's latency_ms delays only non-streamed answers)."""
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sim-4k", "messages": history, "stream": True},
        headers={**AUTH, "X-Session-Id": session, "X-Sim-Context-Window": str(WINDOW)},
        timeout=60,
    )


def storage_key(session: str) -> str:
    return session_from_header(
        tenant_from_headers({"authorization": AUTH["Authorization"]}), session
    ).storage_key


def metric(url: str, name: str, **labels: str) -> float:
    """A counter's value from /metrics; 0 when it was never incremented."""
    text = httpx.get(f"{url}/metrics").text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}_total(?:\{{(.*)\}})? (\S+)$", line)
        if match and (not wanted or wanted in (match.group(1) or "")):
            total += float(match.group(2))
    return total


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"{name}_total", labels) or 0.0


@pytest.fixture
def slow_summaries() -> Iterator[str]:
    """A simulator whose non-streamed answers (the proxy's summary calls) take 1 s."""
    from proxy.simulator import create_simulator_app
    from proxy.simulator.config import SimulatorConfig

    with run_server(create_simulator_app(SimulatorConfig(latency_ms=1000))) as url:
        yield url


def plant(client: redis.Redis, name: str, fields: dict[str, bytes] | dict[str, int]) -> None:
    for field, value in fields.items():
        client.hset(name, field, value)


# Item 5: a stall during summarization must not leave the session locked.


def test_a_lock_release_lost_to_a_redis_stall_does_not_hold_up_the_next_turns(
    slow_summaries: str,
    redis_server: RedisServer,
    raw_redis: redis.Redis,
    start_proxy: Callable[..., str],
) -> None:
    url = start_proxy(settings(slow_summaries, redis_server.url))
    history = long_history("stall")
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(chat(url, "stall", history)))
    worker.start()
    stopped = False
    try:
        # Summary calls take 1 s each: stall Redis while the lock is held, so the
        # snapshot write and the lock release both time out.
        deadline = time.monotonic() + 20
        while not raw_redis.keys("cp:lock:*"):
            assert time.monotonic() < deadline, "the summarization never took its lock"
            time.sleep(0.005)
        redis_server.process.send_signal(signal.SIGSTOP)
        stopped = True
        worker.join(timeout=60)
    finally:
        if stopped:
            redis_server.process.send_signal(signal.SIGCONT)
        worker.join(timeout=60)
    assert first
    assert first[0].status_code == 200, first[0].text
    assert first[0].headers["x-compaction-status"] == "compacted"  # from local state
    assert metric(url, "compaction_proxy_store_errors") >= 1, "the stall never hit the proxy"

    time.sleep(2.5)  # the replica's cool-down: then it uses Redis again
    bound = fast_turn_s(url)
    for n in range(3):
        next_turn(history, n)
        started = time.monotonic()
        r = chat(url, "stall", history)
        took = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert took < bound, f"turn {n} took {took:.1f} s: it waited for a dead lock"
    assert raw_redis.keys("cp:lock:*") == []
    assert raw_redis.keys("cp:snap:*"), "the session's snapshot reached Redis again"
    assert metric(url, "compaction_proxy_lock_release_retries", outcome="released") == 1


def _resilient(url: str, **kw: Any) -> tuple[ResilientStore, Metrics]:
    metrics = Metrics.create()
    store = ResilientStore(RedisStore(url, ttl_s=60), MemoryStore(ttl_s=60), metrics, **kw)
    return store, metrics


async def test_this_replica_settles_its_late_release_before_locking_the_session_again(
    redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    # Background retries far in the future: only the settling acquire can free the lock.
    store, metrics = _resilient(redis_server.url, release_backoff_s=(30.0,))
    try:
        token = await store.acquire(key("s"), 60)
        assert token is not None
        raw_redis.client_pause(600, all=True)
        await store.release(key("s"), token)  # times out: the stall ate it
        assert raw_redis.exists("cp:lock:tenant:h:s")
        await _until_not_degraded(store)
        again = await store.acquire(key("s"), 60)
        assert again is not None, "the lock of a finished summary blocked its own session"
        await store.release(key("s"), again)
        assert not raw_redis.exists("cp:lock:tenant:h:s")
    finally:
        started = time.monotonic()
        await store.aclose()  # cancels the pending retry instead of waiting 30 s
        assert time.monotonic() - started < 15
    assert sample(metrics, "compaction_proxy_lock_release_retries", outcome="released") == 1


async def test_release_retries_stop_at_the_locks_own_expiry(
    redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    store, metrics = _resilient(redis_server.url)
    try:
        token = await store.acquire(key("s"), 0.6)
        assert token is not None
        raw_redis.client_pause(3000, all=True)
        await store.release(key("s"), token)
        await _until(
            lambda: sample(metrics, "compaction_proxy_lock_release_retries", outcome="expired")
        )
    finally:
        await store.aclose()
    # The expiry, not a retry, removed it; no other outcome was counted.
    assert not raw_redis.exists("cp:lock:tenant:h:s")
    assert sample(metrics, "compaction_proxy_lock_release_retries", outcome="released") == 0


async def _until_not_degraded(store: ResilientStore) -> None:
    await _until(lambda: not store.degraded)


async def _until(condition: Callable[[], Any], timeout_s: float = 10) -> None:
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


# Item 6: an unreadable value is "nothing stored" for its own session only.


def _snapshot_fields(version: int = 1) -> dict[str, Any]:
    return {
        "version": version,
        "summary": "valid",
        "pinned": 1,
        "covered": 5,
        "elide_before": 1,
        "anchor_hash": "abc",
        "summary_tokens": 10,
        "tokens_before": 100,
        "tokens_after": 50,
        "created_at": 1.0,
        "updated_at": 2.0,
        "model": "m",
    }


def _other_key_snapshot() -> bytes:
    from cryptography.fernet import Fernet

    data = {**_snapshot_fields(3), "fv": 1}
    return Fernet(Fernet.generate_key()).encrypt(orjson.dumps(data))


UNREADABLE: dict[str, dict[str, bytes]] = {
    "garbage": {"v": b"4", "d": b"\x00\xffnot json at all"},
    "json-list": {"v": b"2", "d": b"[1, 2]"},
    "missing-fields": {"v": b"2", "d": orjson.dumps({"fv": 1, "version": 2})},
    "unknown-field": {"v": b"1", "d": orjson.dumps({**_snapshot_fields(), "fv": 1, "x": 1})},
    "wrong-type": {"v": b"1", "d": orjson.dumps({**_snapshot_fields(), "fv": 1, "summary": 7})},
    "older-format": {"v": b"5", "d": orjson.dumps({**_snapshot_fields(5), "fv": 0})},
    "version-mismatch": {"v": b"9", "d": orjson.dumps({**_snapshot_fields(1), "fv": 1})},
    "version-only": {"v": b"3"},
    "other-fernet-key": {"v": b"3", "d": _other_key_snapshot()},
}


def _snap(version: int, summary: str) -> Snapshot:
    return Snapshot(**{**_snapshot_fields(version), "summary": summary})


@pytest.mark.parametrize("case", sorted(UNREADABLE))
async def test_an_unreadable_snapshot_loads_as_none_and_is_replaced(
    case: str, redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    from cryptography.fernet import Fernet

    plant(raw_redis, "cp:snap:tenant:h:bad", UNREADABLE[case])
    metrics = Metrics.create()
    store = RedisStore(
        redis_server.url,
        ttl_s=60,
        options=RedisOptions(encryption_keys=[Fernet.generate_key().decode()]),
        metrics=metrics,
    )
    try:
        assert await store.load(key("bad")) is None
        assert await store.save(key("bad"), _snap(1, "fresh")), "version 1 must replace it"
        loaded = await store.load(key("bad"))
        assert loaded is not None
        assert loaded.summary == "fresh"
    finally:
        await store.aclose()
    assert sample(metrics, "compaction_proxy_snapshots_unreadable", kind="snapshot") == 1


async def test_a_key_of_the_wrong_redis_type_reads_as_nothing_and_is_replaced(
    redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    raw_redis.set("cp:snap:tenant:h:typed", b"a string, not a hash")
    raw_redis.hset("cp:win:typed", mapping={"a": 1})
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        assert await store.load(key("typed")) is None
        assert await store.save(key("typed"), _snap(1, "fresh"))
        assert await store.load_window("typed") is None
        await store.save_window("typed", 8000, 60)
        assert await store.load_window("typed") == 8000
    finally:
        await store.aclose()


async def test_a_valid_snapshot_written_after_the_unreadable_read_survives(
    redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    """The delete compares what was read: a concurrent writer's snapshot is never lost."""
    stale = {"v": b"4", "d": b"garbage"}
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        plant(raw_redis, "cp:snap:tenant:h:race", stale)
        raw_redis.delete("cp:snap:tenant:h:race")  # someone cleaned up and wrote version 1 since
        assert await store.save(key("race"), _snap(1, "concurrent"))
        # The delete for the garbage read earlier arrives late.
        await store._discard_snapshot(keys=["cp:snap:tenant:h:race"], args=[stale["v"], stale["d"]])
        loaded = await store.load(key("race"))
        assert loaded is not None
        assert loaded.summary == "concurrent"
    finally:
        await store.aclose()


async def test_a_snapshot_of_a_newer_format_is_ignored_but_kept(
    redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    newer = {"v": b"2", "d": orjson.dumps({**_snapshot_fields(2), "fv": 99})}
    plant(raw_redis, "cp:snap:tenant:h:new", newer)
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        assert await store.load(key("new")) is None
    finally:
        await store.aclose()
    assert raw_redis.hgetall("cp:snap:tenant:h:new") == {k.encode(): v for k, v in newer.items()}


@pytest.mark.parametrize("value", [b"lots", b"-5", b"0", b"1.5e3"])
async def test_an_unreadable_learned_window_loads_as_none_and_is_replaced(
    value: bytes, redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    raw_redis.set("cp:win:m", value)
    metrics = Metrics.create()
    store = RedisStore(redis_server.url, ttl_s=60, metrics=metrics)
    try:
        assert await store.load_window("m") is None
        assert not raw_redis.exists("cp:win:m")
        await store.save_window("m", 8000, 60)
        assert await store.load_window("m") == 8000
        assert await store.learned_windows() == {"m": 8000}
    finally:
        await store.aclose()
    assert sample(metrics, "compaction_proxy_snapshots_unreadable", kind="window") == 1


async def test_listings_skip_unreadable_entries(
    redis_server: RedisServer, raw_redis: redis.Redis
) -> None:
    plant(raw_redis, "cp:snap:tenant:h:bad", UNREADABLE["garbage"])
    raw_redis.set("cp:snap:tenant:h:typed", b"x")
    plant(raw_redis, "cp:snap:not-a-session-key", {"v": b"1", "d": b"{}"})
    raw_redis.set("cp:win:bad", b"lots")
    raw_redis.hset("cp:win:typed", mapping={"a": 1})
    store = RedisStore(redis_server.url, ttl_s=60)
    try:
        assert await store.save(key("good"), _snap(1, "good"))
        await store.save_window("good", 8000, 60)
        assert [k for k, _ in await store.list_sessions(10)] == [key("good")]
        assert await store.learned_windows() == {"good": 8000}
    finally:
        await store.aclose()


def test_unreadable_snapshots_are_replaced_per_session_while_others_are_served_from_redis(
    sim_reset: str,
    redis_server: RedisServer,
    raw_redis: redis.Redis,
    start_proxy: Callable[..., str],
) -> None:
    from cryptography.fernet import Fernet

    key = Fernet.generate_key().decode()
    # What this test is about is unreadable values, not a slow store: a generous call
    # timeout keeps a loaded machine's stall from reading as an outage.
    config = settings(sim_reset, redis_server.url, encryption_keys=[key], timeout_s=2.0)
    replicas = [start_proxy(config), start_proxy(config)]
    a, b = replicas

    # A healthy session, compacted on replica B: its snapshot lives only in Redis.
    healthy = long_history("healthy")
    r = chat(b, "healthy", healthy)
    assert r.status_code == 200, r.text
    assert r.headers["x-compaction-status"] == "compacted"

    # Two sessions whose stored snapshots nobody can read any more.
    planted = {"garbage": UNREADABLE["garbage"], "rekeyed": UNREADABLE["other-fernet-key"]}
    for session, fields in planted.items():
        plant(raw_redis, f"cp:snap:{storage_key(session)}", fields)
    errors_before = [metric(u, "compaction_proxy_store_errors") for u in replicas]

    histories = {session: long_history(session) for session in planted}
    for n in range(3):
        for session, history in histories.items():
            r = chat(a, session, history)
            assert r.status_code == 200, r.text
            next_turn(history, n)
            # Right after replica A met the unreadable value, it still serves the
            # healthy session from Redis: nothing marked the whole store degraded.
            next_turn(healthy, f"{session}-{n}")
            r = chat(a, "healthy", healthy)
            assert r.status_code == 200, r.text
            assert r.headers["x-compaction-status"] == "snapshot"
            assert r.headers["x-compaction-version"] == "1"

    for u in replicas:
        assert httpx.get(f"{u}/readyz").json()["store"] == "ok"
    assert [metric(u, "compaction_proxy_store_errors") for u in replicas] == errors_before
    assert metric(a, "compaction_proxy_snapshots_unreadable", kind="snapshot") == 2
    for session in planted:
        for u in replicas:  # written to Redis: the other replica sees it too
            info = httpx.get(f"{u}/sessions/{session}", headers=AUTH)
            assert info.status_code == 200, info.text
            assert info.json()["version"] == 1
        stored = raw_redis.hget(f"cp:snap:{storage_key(session)}", "d")
        assert stored is not None
        assert orjson.loads(Fernet(key.encode()).decrypt(stored))["version"] == 1


# Issue 13: Redis flushed, paused, killed or locked away mid-conversation. Every turn is
# answered, its newest message reaches the upstream, no lock is left behind, and what
# Redis holds afterwards is a snapshot this release reads.


def newest_forwarded(sim: str) -> str:
    """The last user message of the last chat the proxy forwarded (not a summary call)."""
    chats = [
        r
        for r in httpx.get(f"{sim}/_sim/requests").json()
        if r["headers"].get("x-compaction-purpose") != "summarize"
    ]
    return str(chats[-1]["body"]["messages"][-1]["content"])


def assert_readable_snapshot(client: redis.Redis, session: str) -> int:
    """The session's snapshot in Redis decodes; its version."""
    from proxy.store.codec import decode_stored

    stored = client.hmget(f"cp:snap:{storage_key(session)}", ["v", "d"])
    snapshot = decode_stored(stored[0], stored[1], None)
    assert snapshot is not None
    return snapshot.version


def turns(
    url: str,
    sim: str,
    session: str,
    history: list[dict[str, Any]],
    n: int,
    bound: float | None = None,
) -> list[str]:
    """``n`` more turns, each answered within ``bound`` (default: ``fast_turn_s`` now) with
    its newest message forwarded; their X-Compaction-Status values."""
    bound = fast_turn_s(url) if bound is None else bound
    statuses = []
    for i in range(n):
        next_turn(history, f"{session}-{i}")
        started = time.monotonic()
        r = chat(url, session, history)
        took = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert took < bound, f"turn {i} took {took:.1f} s"
        assert newest_forwarded(sim) == history[-1]["content"]
        statuses.append(r.headers["x-compaction-status"])
    return statuses


def test_redis_flushed_mid_conversation_and_mid_summary_is_compacted_again(
    slow_summaries: str,
    redis_server: RedisServer,
    raw_redis: redis.Redis,
    start_proxy: Callable[..., str],
) -> None:
    url = start_proxy(settings(slow_summaries, redis_server.url))
    history = long_history("flush")
    assert chat(url, "flush", history).headers["x-compaction-status"] == "compacted"
    assert assert_readable_snapshot(raw_redis, "flush") == 1

    raw_redis.flushall()  # between turns: the session starts over from its history
    history = long_history("flush")  # over the trigger again, so the next turn compacts
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(chat(url, "flush", history)))
    worker.start()
    deadline = time.monotonic() + 20
    while not raw_redis.keys("cp:lock:*"):  # and again while that turn summarizes
        assert time.monotonic() < deadline, "the summarization never took its lock"
        time.sleep(0.005)
    raw_redis.flushall()
    worker.join(timeout=60)
    assert first, "the turn never finished"
    assert first[0].status_code == 200, first[0].text
    assert first[0].headers["x-compaction-status"] == "compacted"
    assert newest_forwarded(slow_summaries) == history[-1]["content"]

    assert set(turns(url, slow_summaries, "flush", history, 3)) <= {"snapshot", "compacted"}
    assert raw_redis.keys("cp:lock:*") == []
    assert assert_readable_snapshot(raw_redis, "flush") >= 1
    assert metric(url, "compaction_proxy_store_errors") == 0  # a flush is no outage


def test_redis_client_pause_mid_conversation_does_not_hold_up_turns(
    sim_reset: str,
    redis_server: RedisServer,
    raw_redis: redis.Redis,
    start_proxy: Callable[..., str],
) -> None:
    url = start_proxy(settings(sim_reset, redis_server.url))
    history = long_history("pause")
    assert chat(url, "pause", history).headers["x-compaction-status"] == "compacted"

    bound = fast_turn_s(url)  # measured before the pause, not in it
    # Every client, the proxy's included, waits; long enough for three turns on a busy
    # machine, which a turn that waited for Redis would outlast.
    raw_redis.client_pause(8000, all=True)
    paused_until = time.monotonic() + 8.0
    statuses = turns(url, sim_reset, "pause", history, 3, bound)
    assert time.monotonic() < paused_until, "the turns were slower than the pause itself"
    assert metric(url, "compaction_proxy_store_errors") >= 1
    assert set(statuses) <= {"snapshot", "compacted"}  # local state kept the summary

    time.sleep(max(0.0, paused_until - time.monotonic()) + 2.5)  # pause over, cool-down too
    turns(url, sim_reset, "pause", history, 2)
    assert httpx.get(f"{url}/readyz").json()["store"] == "ok"
    assert raw_redis.keys("cp:lock:*") == []
    assert assert_readable_snapshot(raw_redis, "pause") >= 1


def test_redis_killed_mid_summary_then_restarted_empty(
    slow_summaries: str,
    redis_server: RedisServer,
    start_proxy: Callable[..., str],
) -> None:
    url = start_proxy(settings(slow_summaries, redis_server.url))
    watcher = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    history = long_history("killed")
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(chat(url, "killed", history)))
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while not watcher.keys("cp:lock:*"):
            assert time.monotonic() < deadline, "the summarization never took its lock"
            time.sleep(0.005)
    finally:
        watcher.close()
    redis_server.stop()  # SIGKILL while the lock is held and the summary is being written
    worker.join(timeout=60)
    assert first, "the turn never finished"
    assert first[0].status_code == 200, first[0].text
    assert first[0].headers["x-compaction-status"] == "compacted"  # from local state
    assert newest_forwarded(slow_summaries) == history[-1]["content"]
    turns(url, slow_summaries, "killed", history, 2)  # Redis down: still served
    assert httpx.get(f"{url}/readyz").json()["store"] == "unreachable (connection)"

    redis_server.start()  # same port, nothing in it
    time.sleep(2.5)  # the replica's cool-down
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        # Until the session is compacted into the new Redis (long turns: the 4k window
        # fills again within a few).
        deadline = time.monotonic() + 60
        while not client.keys("cp:snap:*"):
            assert time.monotonic() < deadline, "compaction never reached Redis again"
            history.append({"role": "assistant", "content": "ok"})
            history.append({"role": "user", "content": f"more: {FILLER}"})
            r = chat(url, "killed", history)
            assert r.status_code == 200, r.text
        assert client.keys("cp:lock:*") == []
        assert assert_readable_snapshot(client, "killed") >= 1
    finally:
        client.close()
    assert httpx.get(f"{url}/readyz").json()["store"] == "ok"


@pytest.fixture
def redis_with_password() -> Iterator[RedisServer]:
    from tests.support.servers import redis_binary

    with RedisServer(redis_binary(), password="the-proxy-does-not-know-it").running() as server:
        yield server


def test_redis_password_the_proxy_lacks_degrades_instead_of_failing(
    sim_reset: str, redis_with_password: RedisServer, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset, redis_with_password.url))  # no password in it
    history = long_history("noauth")
    r = chat(url, "noauth", history)
    assert r.status_code == 200, r.text
    assert r.headers["x-compaction-status"] == "compacted"  # from local state
    assert newest_forwarded(sim_reset) == history[-1]["content"]
    assert set(turns(url, sim_reset, "noauth", history, 2)) <= {"snapshot", "compacted"}
    assert httpx.get(f"{url}/readyz").json() == {"ready": True, "store": "unreachable (auth)"}
    assert metric(url, "compaction_proxy_store_errors") >= 1
    # With the password the same store works: it was the missing password, nothing else.
    password = redis_with_password.password
    authed = redis_with_password.url.replace("redis://", f"redis://:{password}@")
    url = start_proxy(settings(sim_reset, authed))
    assert chat(url, "authed", long_history("authed")).status_code == 200
    client = redis.Redis.from_url(authed, socket_timeout=5)
    try:
        assert assert_readable_snapshot(client, "authed") == 1
    finally:
        client.close()
    assert httpx.get(f"{url}/readyz").json()["store"] == "ok"
