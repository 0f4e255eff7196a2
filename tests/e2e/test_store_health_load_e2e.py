"""Under load, a full, read-only or killed Redis (one server, and one primary of a
Cluster) keeps ``/readyz`` (``server.ready_requires_store``) not-ok for the whole fault,
polled every 0.2 s, with ``store_degraded`` at 1, and sessions are summarized about once
per snapshot version, not again from the store's stale snapshot. A write that did not
happen (a compare-and-swap that lost, a DEL a full Redis still runs) must not end the
failure: readiness would flap, and while it read ok the store's old snapshot would be
served, each session summarized again. A Cluster's fault names how many primaries refuse.

Real redis-servers started here, a real proxy under uvicorn, the simulator upstream;
the load is bounded in turns and time. (The logic on a fake clock:
tests/store/test_store_watch.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis
from redis.crc import key_slot

from proxy.core.session import session_from_header
from proxy.core.tenant_ids import TenantIds
from tests.e2e.test_store_health_e2e import sample
from tests.support.chat import FILLER, WINDOW, stats
from tests.support.redis_cluster import RedisCluster
from tests.support.servers import RedisServer, proxy_settings, redis_binary

pytestmark = pytest.mark.redis

AUTH = {"Authorization": "Bearer sk-load"}
SESSIONS = 4
POLL_S = 0.2
FAULT_S = 5.0  # polled at least this long from the first not-ok...
MIN_VERSIONS = 4  # ...and until the sessions went through this many versions in it,
EXTEND_S = 25.0  # for at most this much longer
FAILS_WITHIN_S = 5.0
MAX_TURNS = 3000
MAX_S = 90.0
# Summaries per snapshot version a session went through during the fault, at most.
SUMMARIES_PER_VERSION = 1.5


def settings(sim: str, url: str) -> Any:
    return proxy_settings(
        sim,
        store={"url": url},
        server={"ready_requires_store": True},
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None},
    )


@dataclass
class Load:
    """``sessions`` conversations through the proxy at ``url``, one turn after another
    round robin in a thread until stopped (at most MAX_TURNS, MAX_S): each turn long
    enough that a session compacts every few turns. Every answer's compaction status
    and version, and when it came."""

    url: str
    sessions: list[str]
    turns: list[tuple[float, str, str, int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._histories: dict[str, list[dict[str, Any]]] = {
            s: [{"role": "system", "content": "You are helpful."}] for s in self.sessions
        }

    def _run(self) -> None:
        started = time.monotonic()
        with httpx.Client(timeout=30) as client:
            for n in range(MAX_TURNS):
                if self._stop.is_set() or time.monotonic() - started > MAX_S:
                    return
                session = self.sessions[n % len(self.sessions)]
                history = self._histories[session]
                history.append({"role": "user", "content": f"{session} turn {n}: {FILLER * 2}"})
                r = client.post(
                    f"{self.url}/v1/chat/completions",
                    json={"model": "sim-4k", "messages": history},
                    headers={
                        **AUTH,
                        "X-Session-Id": session,
                        "X-Sim-Context-Window": str(WINDOW),
                    },
                )
                if r.status_code != 200:
                    self.failures.append(f"{r.status_code}: {r.text[:200]}")
                    history.pop()
                    continue
                answer = r.json()["choices"][0]["message"]["content"]
                history.append({"role": "assistant", "content": answer})
                status, version = (
                    r.headers["x-compaction-status"],
                    r.headers["x-compaction-version"],
                )
                self.turns.append((time.monotonic(), session, status, int(version)))

    def compacted(self, since: float = 0.0) -> set[tuple[str, int]]:
        """The (session, version) of each compaction answered from ``since``: the versions
        summarized, each counted once."""
        return {
            (s, v) for t, s, status, v in list(self.turns) if since <= t and status == "compacted"
        }

    def stop(self) -> None:
        """No turn after the one in flight, which has answered when this returns: every
        summary made so far has the version it made counted (``compacted``)."""
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "a turn did not answer within 60 s"

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def until(condition: Callable[[], bool], limit_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < limit_s, what
        time.sleep(0.05)
    return time.monotonic() - started


@dataclass
class Polls:
    """What /readyz and the gauge said at each poll through the fault."""

    ready: list[tuple[int, str]] = field(default_factory=list)
    gauge: list[float] = field(default_factory=list)

    def flaps(self) -> list[int]:
        return [i for i, (status, _) in enumerate(self.ready) if status != 503]


def under_load(
    url: str,
    sim: str,
    inject: Callable[[], object],
    recover: Callable[[], object],
    sessions: list[str],
) -> tuple[Polls, Load, int, int]:
    """Sessions compacting through the proxy at ``url``, a fault injected under them, and
    /readyz and the gauge polled every POLL_S for FAULT_S from its first not-ok, longer
    (at most EXTEND_S) until MIN_VERSIONS were summarized in the fault; then the load
    stopped, the fault ended, and /readyz ok again. What the polls said, the load, and
    the summaries and versions summarized from the fault to the load's end (the same
    window for both: no summary is counted whose version was not)."""
    polls = Polls()
    with httpx.Client(timeout=5) as http, Load(url, sessions) as load:
        until(
            lambda: {s for s, _ in load.compacted()} == set(sessions),
            30,
            "every session compacted before the fault",
        )
        assert http.get(f"{url}/readyz").status_code == 200
        before, injected = stats(sim)["summaries"], time.monotonic()
        inject()
        try:
            until(
                lambda: http.get(f"{url}/readyz").status_code == 503, FAILS_WITHIN_S, "never not-ok"
            )
            first, tick = time.monotonic(), 0
            while tick < FAULT_S / POLL_S or len(load.compacted(injected)) < MIN_VERSIONS:
                seen = len(load.compacted(injected))
                assert time.monotonic() - first < FAULT_S + EXTEND_S, (
                    f"{seen} versions summarized in {FAULT_S + EXTEND_S} s of the fault"
                )
                tick += 1
                r = http.get(f"{url}/readyz")
                polls.ready.append((r.status_code, r.json()["store"]))
                polls.gauge.append(sample(url, "compaction_proxy_store_degraded"))
                time.sleep(max(0.0, first + tick * POLL_S - time.monotonic()))
            load.stop()
            summaries = stats(sim)["summaries"] - before
        finally:
            recover()
        until(lambda: http.get(f"{url}/readyz").status_code == 200, 15, "never ok again")
    versions = len(load.compacted(injected))
    assert load.failures == [], load.failures[:3]
    return polls, load, summaries, versions


def assert_held(polls: Polls, summaries: int, versions: int, store: str) -> None:
    statuses = [status for status, _ in polls.ready]
    assert len(statuses) >= FAULT_S / POLL_S
    assert polls.flaps() == [], f"/readyz ok at polls {polls.flaps()} of {len(statuses)}"
    assert set(polls.gauge) == {1.0}, f"store_degraded: {polls.gauge}"
    assert {said for _, said in polls.ready[-3:]} == {store}, polls.ready[-3:]
    assert versions >= MIN_VERSIONS
    assert summaries <= SUMMARIES_PER_VERSION * versions, (
        f"{summaries} summaries for {versions} versions"
    )


def make_full(client: redis.Redis, key: str = "one-more") -> None:
    """``maxmemory`` far below what the server uses, with ``noeviction``: every write that
    may grow memory is refused (OOM); reads, DEL and scripts that end before a write run.
    ``key``: one the server serves (a cluster node's own slots)."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set(key, b"x")


def names(n: int, prefix: str) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def test_a_full_redis_under_load_keeps_readiness_failed_for_the_whole_fault(
    sim_reset: str,
    redis_server: RedisServer,
    raw_redis: redis.Redis,
    start_proxy: Callable[..., str],
) -> None:
    url = start_proxy(settings(sim_reset, redis_server.url))
    polls, _, summaries, versions = under_load(
        url,
        sim_reset,
        inject=lambda: make_full(raw_redis),
        recover=lambda: raw_redis.config_set("maxmemory", 0),
        sessions=names(SESSIONS, "full"),
    )
    print(f"full: {summaries} summaries for {versions} versions, {len(polls.ready)} polls")
    assert_held(polls, summaries, versions, "degraded (oom)")


def test_a_read_only_redis_under_load_keeps_readiness_failed_for_the_whole_fault(
    sim_reset: str,
    redis_server: RedisServer,
    raw_redis: redis.Redis,
    redis_primary: RedisServer,
    start_proxy: Callable[..., str],
) -> None:
    url = start_proxy(settings(sim_reset, redis_server.url))
    raw_redis.config_set("repl-diskless-load", "swapdb")  # no dump.rdb written in the cwd
    polls, _, summaries, versions = under_load(
        url,
        sim_reset,
        # As a failover demotes it.
        inject=lambda: raw_redis.replicaof("127.0.0.1", redis_primary.port),
        recover=lambda: raw_redis.replicaof("no", "one"),
        sessions=names(SESSIONS, "replica"),
    )
    print(f"read-only: {summaries} summaries for {versions} versions, {len(polls.ready)} polls")
    assert_held(polls, summaries, versions, "degraded (readonly)")


def test_a_killed_redis_under_load_keeps_readiness_failed_until_it_is_back(
    sim_reset: str, redis_server: RedisServer, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset, redis_server.url))
    polls, _, summaries, versions = under_load(
        url,
        sim_reset,
        inject=redis_server.stop,  # SIGKILL, by PID
        recover=redis_server.start,  # the same port, empty
        sessions=names(SESSIONS, "killed"),
    )
    print(f"killed: {summaries} summaries for {versions} versions, {len(polls.ready)} polls")
    assert_held(polls, summaries, versions, "unreachable (connection)")


# A Cluster: one primary full. The probe key of one server's layout lives on one
# primary; the one made full here is another, which a probe of that key alone misses.


def slot_owners(cluster: RedisCluster) -> dict[int, int]:
    """Slot -> index of the primary (in ``cluster.node_urls``) that serves it."""
    client = redis.Redis.from_url(cluster.node_urls[0], socket_timeout=2)
    try:
        ranges = client.execute_command("CLUSTER", "SLOTS")
    finally:
        client.close()
    ports = {p: i for i, p in enumerate(cluster.ports)}
    return {slot: ports[int(r[2][1])] for r in ranges for slot in range(int(r[0]), int(r[1]) + 1)}


def test_one_full_cluster_primary_under_load_keeps_readiness_failed_and_names_it(
    sim_reset: str, redis_cluster: RedisCluster, start_proxy: Callable[..., str]
) -> None:
    owners = slot_owners(redis_cluster)
    probed = owners[key_slot(b"cp:health:probe")]
    full = next(i for i in range(redis_cluster.PRIMARIES) if i != probed)
    own = next(n for n in names(200, "own") if owners[key_slot(n.encode())] == full)
    configured = settings(sim_reset, redis_cluster.url)
    sessions = sessions_on(owners, full, "cluster", TenantIds.from_settings(configured))
    url = start_proxy(configured)
    node = redis.Redis.from_url(redis_cluster.node_urls[full], socket_timeout=5)
    try:
        polls, _, summaries, versions = under_load(
            url,
            sim_reset,
            inject=lambda: make_full(node, own),
            recover=lambda: node.config_set("maxmemory", 0),
            sessions=sessions,
        )
    finally:
        node.config_set("maxmemory", 0)  # the cluster serves the session's other tests
        node.close()
    print(f"cluster: {summaries} summaries for {versions} versions, {len(polls.ready)} polls")
    assert_held(polls, summaries, versions, "degraded (oom, 1/3 primaries)")


def sessions_on(owners: dict[int, int], primary: int, prefix: str, ids: TenantIds) -> list[str]:
    """Two sessions whose snapshots are on ``primary``, two on other primaries, for the
    tenant ``ids`` (the proxy's, from its settings) gives AUTH."""
    tenant = ids.of({"authorization": AUTH["Authorization"]})

    def on(name: str) -> int:
        key = session_from_header(tenant, name).storage_key
        return owners[key_slot(f"cp:snap:{{{key}}}".encode())]

    candidates = names(200, prefix)
    return [s for s in candidates if on(s) == primary][:2] + [
        s for s in candidates if on(s) != primary
    ][:2]


def test_a_killed_cluster_primary_keeps_readiness_failed_until_its_replica_serves(
    sim_reset: str, tmp_path: Any, start_proxy: Callable[..., str]
) -> None:
    """Each primary with a replica; one primary killed under load: not ok until the
    replica has taken its slots (a probe write on every primary), and not ok meanwhile
    whatever the other primaries take."""
    cluster = RedisCluster(redis_binary(), tmp_path, full_coverage=False, replicas=1)
    cluster.start()
    try:
        owners = slot_owners(cluster)
        before = cluster.primaries()
        assert len(before) == RedisCluster.PRIMARIES
        victim = next(i for i in before if i != owners[key_slot(b"cp:health:probe")])
        configured = settings(sim_reset, cluster.url)
        sessions = sessions_on(owners, victim, "failover", TenantIds.from_settings(configured))
        url = start_proxy(configured)
        said: list[tuple[int, str]] = []
        with httpx.Client(timeout=5) as http, Load(url, sessions) as load:
            until(
                lambda: {s for s, _ in load.compacted()} == set(sessions),
                30,
                "every session compacted before the fault",
            )
            summaries, killed = stats(sim_reset)["summaries"], time.monotonic()
            cluster.kill_node(victim)  # SIGKILL, by PID
            until(
                lambda: http.get(f"{url}/readyz").status_code == 503,
                FAILS_WITHIN_S,
                "never not-ok",
            )
            deadline = time.monotonic() + 30
            while not said or said[-1][0] != 200:
                assert time.monotonic() < deadline, f"never ok again: {said[-3:]}"
                r = http.get(f"{url}/readyz")
                said.append((r.status_code, r.json()["store"]))
                if r.status_code == 200:
                    promoted = cluster.primaries()  # at once: has the replica taken over?
                    break
                time.sleep(POLL_S)
            load.stop()  # counted over the same window as the versions
            summaries = stats(sim_reset)["summaries"] - summaries
        versions = len(load.compacted(killed))
        assert load.failures == [], load.failures[:3]
    finally:
        cluster.stop()
    print(f"failover: {summaries} summaries for {versions} versions, {len(said)} polls")
    assert victim not in promoted
    assert len(promoted) == RedisCluster.PRIMARIES, (
        f"ok after {len(said)} polls, before a replica took the slots: {said[-3:]}"
    )
    assert "unreachable (connection, 1/3 primaries)" in {store for _, store in said}, said
    assert summaries <= SUMMARIES_PER_VERSION * max(versions, 1), (
        f"{summaries} summaries for {versions} versions"
    )
