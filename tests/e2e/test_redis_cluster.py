"""Issue 23: the store on a real 3-primary Redis Cluster (``redis+cluster://``), shared by
proxy processes; a plain ``redis://`` URL to a cluster node is refused at start-up.

The store contract runs on the cluster too (tests/store/test_store_contract.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from proxy.config import Settings
from proxy.core.session import SessionKey, tenant_of
from proxy.errors import ConfigError, StoreError
from proxy.services import build_services
from proxy.store import Sighting
from proxy.store.connect import refuse_cluster_node
from proxy.store.redis import RedisOptions, RedisStore
from proxy.upstream.windows import window_key
from tests.e2e.test_redis import ReplicaChat, replica_config, session_info
from tests.support.chat import FILLER, stats
from tests.support.processes import cli, write_config
from tests.support.redis_cluster import RedisCluster
from tests.support.servers import redis_binary
from tests.support.snapshots import snap

pytestmark = pytest.mark.redis

TENANT = tenant_of("Bearer sk-tenant-a")  # ReplicaChat's default key


def keys_by_node(cluster: RedisCluster, pattern: str = "cp:*") -> list[list[str]]:
    """Each primary's keys matching ``pattern``, read from the node itself."""
    out = []
    for url in cluster.node_urls:
        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            out.append(sorted(k.decode() for k in client.scan_iter(match=pattern, count=500)))
        finally:
            client.close()
    return out


def keyslot(cluster: RedisCluster, name: str) -> int:
    client = redis.Redis.from_url(cluster.node_urls[0], socket_timeout=2)
    try:
        return int(client.execute_command("CLUSTER", "KEYSLOT", name))
    finally:
        client.close()


def test_two_replicas_share_conversations_on_a_cluster_one_summary_per_version(
    sim_reset: str, redis_cluster: RedisCluster, spawn_proxy: Callable[..., str]
) -> None:
    config = replica_config(sim_reset, redis_cluster.url)
    config["server"] = {"admin_key": "adm-cluster"}
    urls = [spawn_proxy(config) for _ in range(2)]
    # Sessions whose keys fall on different primaries (checked below, not assumed).
    sessions = [f"shared-{i}" for i in range(3)]
    for session in sessions:
        chat = ReplicaChat(urls, session=session)
        chat.say(f"FACT city=lisbon-{session}")
        for turn in range(70):
            chat.say(f"Turn {turn}: {FILLER}")
        assert chat.say("RECALL city") == f"city=lisbon-{session}"
    versions = 0
    for session in sessions:
        info = [session_info(u, session) for u in urls]
        assert info[0] == info[1]
        assert info[0]["version"] >= 2  # summarized again over a summary
        versions += info[0]["version"]
    # Every summarization became exactly one snapshot version, whichever replica ran it:
    # no replica summarized on its own for want of the store.
    summaries = stats(sim_reset)["summaries"]
    assert versions == summaries
    # A session keeps several snapshots (its slots, session.explicit_slots).
    snapshots = keys_by_node(redis_cluster, "cp:snap:*")
    assert sum(1 for keys in snapshots if keys) >= 2  # the sessions span primaries
    # The admin listing reads every primary.
    listing = httpx.get(
        f"{urls[1]}/admin/sessions", headers={"Authorization": "Bearer adm-cluster"}
    )
    assert listing.status_code == 200, listing.text
    assert len(listing.json()["data"]) == sum(len(keys) for keys in snapshots)
    # DELETE removes a session's snapshot and sighting (one slot, one DEL).
    gone = httpx.delete(
        f"{urls[0]}/sessions/{sessions[0]}", headers={"Authorization": "Bearer sk-tenant-a"}
    )
    assert gone.status_code in (200, 204), gone.text
    left = [k for keys in keys_by_node(redis_cluster) for k in keys if sessions[0] in k]
    assert left == []


async def test_a_sessions_keys_share_one_slot_and_sessions_spread_over_every_primary(
    redis_cluster: RedisCluster,
) -> None:
    store = RedisStore(redis_cluster.url, ttl_s=3600)
    try:
        for i in range(30):
            key = SessionKey(TENANT, f"spread-{i}", "header")
            assert await store.save(key, snap(1, f"summary {i}"))
            await store.note_seen(key, Sighting(messages=3, tokens=10, model="m", seen_at=1.0))
            assert await store.acquire(key, 30) is not None
        listed = await store.list_sessions(100)
    finally:
        await store.aclose()
    by_node = keys_by_node(redis_cluster)
    assert all(by_node), by_node  # every primary holds some
    for i in range(30):
        names = [n for keys in by_node for n in keys if n.rstrip("}").endswith(f":spread-{i}")]
        assert len(names) == 3, names  # snap, seen, lock
        assert len({keyslot(redis_cluster, n) for n in names}) == 1, names
        assert sum(1 for keys in by_node if set(names) & set(keys)) == 1
    assert len(listed) == 30


async def test_check_config_reads_learned_windows_from_every_primary(
    tmp_path: Path, redis_cluster: RedisCluster
) -> None:
    store = RedisStore(redis_cluster.url, ttl_s=3600)
    try:
        for i in range(12):
            await store.save_window(window_key("http://up/v1", f"model-{i}"), 4096 + i, 3600)
    finally:
        await store.aclose()
    assert sum(1 for keys in keys_by_node(redis_cluster, "cp:win:*") if keys) >= 2
    out = cli("check-config", write_config(tmp_path, {"store": {"url": redis_cluster.url}}))
    assert out.returncode == 0, out.stderr
    assert "learned windows: 12" in out.stdout, out.stdout
    for i in range(12):
        assert f"model-{i} " in out.stdout


async def test_a_burst_of_calls_waits_for_connections_instead_of_failing(
    redis_cluster: RedisCluster,
) -> None:
    """Past the connections a node may have (100), calls queue as on one server."""
    store = RedisStore(redis_cluster.url, ttl_s=3600, options=RedisOptions(timeout_s=2.0))
    keys = [SessionKey(TENANT, f"burst-{i}", "header") for i in range(30)]
    try:
        for key in keys:
            await store.note_seen(key, Sighting(messages=1, tokens=1, model="m", seen_at=1.0))
        found = await asyncio.gather(*(store.load_seen(keys[i % 30]) for i in range(600)))
    finally:
        await store.aclose()
    assert all(sighting is not None for sighting in found)


async def test_a_burst_of_first_calls_on_a_new_client_all_succeed(
    redis_cluster: RedisCluster,
) -> None:
    """The first calls of a replica (a burst at start-up) wait for the slot map: sent
    before it, they draw MOVED, and redis-py's refresh closed connections in use (1 in 6
    rounds failed)."""
    for round_ in range(40):
        store = RedisStore(redis_cluster.url, ttl_s=3600)
        key = SessionKey(TENANT, f"first-{round_}", "header")
        try:
            tokens = await asyncio.gather(*(store.acquire(key, 60) for _ in range(10)))
        finally:
            await store.aclose()
        assert sum(token is not None for token in tokens) == 1


async def test_a_primary_down_fails_its_own_slots_only(tmp_path: Path) -> None:
    """The other primaries keep serving their sessions (redis-py refreshed its slot map
    through the dead primary and failed every call)."""
    cluster = RedisCluster(redis_binary(), tmp_path, full_coverage=False)
    cluster.start()
    store = RedisStore(cluster.url, ttl_s=3600)
    try:
        keys = [SessionKey(TENANT, f"down-{i}", "header") for i in range(30)]
        for key in keys:
            assert await store.save(key, snap(1))
        on_dead = set(keys_by_node(cluster, "cp:snap:*")[0])
        cluster.kill_node(0)
        served = failed = 0
        for key in keys:
            try:
                assert await store.load(key) == snap(1)
                served += 1
            except StoreError:
                failed += 1
                assert f"cp:snap:{{{key.storage_key}}}" in on_dead
        assert served == len(keys) - len(on_dead)
        assert failed == len(on_dead) > 0
    finally:
        await store.aclose()
        cluster.stop()


async def test_a_tls_cluster_with_a_password_serves_the_store(tmp_path: Path) -> None:
    """rediss+cluster://:password@…?ssl_ca_certs=…: TLS and AUTH on every node the client
    finds, not only the ones named; a plain rediss:// URL to one node is refused."""
    cluster = RedisCluster(redis_binary(), tmp_path, password="cl-secret", tls=True)
    cluster.start()
    assert cluster.url.startswith("rediss+cluster://:cl-secret@")
    first_node_only = cluster.url.split(",")[0] + "?" + cluster.url.split("?")[1]
    store = RedisStore(first_node_only, ttl_s=3600)
    try:
        keys = [SessionKey(TENANT, f"tls-{i}", "header") for i in range(20)]
        for key in keys:
            assert await store.save(key, snap(1, "over tls"))
        assert [s and s.summary for s in await store.load_many(keys)] == ["over tls"] * 20
        assert len(await store.list_sessions(100)) == 20
        assert await store.delete(keys[0])
        assert await store.ping()
        assert all(keys_by_node(cluster))  # every primary, reached over TLS
        with pytest.raises(ConfigError, match=r"redis\+cluster://"):
            await refuse_cluster_node(cluster.node_urls[2])
    finally:
        await store.aclose()
        cluster.stop()


def test_a_plain_redis_url_to_a_cluster_node_refuses_to_start(
    tmp_path: Path, redis_cluster: RedisCluster
) -> None:
    path = write_config(tmp_path, {"store": {"url": redis_cluster.node_urls[0]}})
    served = cli("serve", "--config", path, "--host", "127.0.0.1", "--port", "0")
    assert served.returncode == 2, served.stderr
    assert "redis+cluster://" in served.stderr
    assert "Traceback" not in served.stderr
    checked = cli("check-config", path)
    assert checked.returncode == 2, checked.stdout
    assert "redis+cluster://" in checked.stderr


async def test_an_app_on_a_plain_redis_url_to_a_cluster_node_does_not_start(
    redis_cluster: RedisCluster,
) -> None:
    """The lifespan refuses too: an app served without ``compaction-proxy serve``."""
    settings = Settings(store={"url": redis_cluster.node_urls[1]})
    with pytest.raises(ConfigError, match=r"redis\+cluster://"):
        await build_and_close(settings)


async def build_and_close(settings: Settings) -> None:
    """Build the app's services and close them again (not left open should they start)."""
    services = await build_services(settings)
    await services.aclose()


def test_a_standalone_server_is_not_refused(tmp_path: Path, redis_server: Any) -> None:
    out = cli("check-config", write_config(tmp_path, {"store": {"url": redis_server.url}}))
    assert out.returncode == 0, out.stderr


async def test_the_readiness_probe_writes_on_every_primary_and_names_the_one_refusing(
    redis_cluster: RedisCluster,
) -> None:
    """One key hashes to one primary: the probe writes a key of its own on each, and a
    full one is named (the proxy's /readyz: 'degraded (oom, 1/3 primaries)')."""
    from proxy.store.health import ProbeFailed

    store = RedisStore(redis_cluster.url, ttl_s=3600)
    full = redis.Redis.from_url(redis_cluster.node_urls[1], socket_timeout=2)
    try:
        assert not store.one_server
        await store.probe()
        probes = keys_by_node(redis_cluster, "cp:health:probe*")
        assert all(len(keys) == 1 for keys in probes), probes
        full.config_set("maxmemory-policy", "noeviction")
        full.config_set("maxmemory", 1)
        with pytest.raises(ProbeFailed) as failed:
            await store.probe()
        assert failed.value.failing == (f"127.0.0.1:{redis_cluster.ports[1]}",)
        assert failed.value.primaries == 3
        assert isinstance(failed.value.__cause__, redis.exceptions.OutOfMemoryError)
    finally:
        full.config_set("maxmemory", 0)
        full.close()
        await store.aclose()
    again = RedisStore(redis_cluster.url, ttl_s=3600)
    try:
        await again.probe()  # room again: every primary takes it
    finally:
        await again.aclose()
