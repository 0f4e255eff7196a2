"""The harness's Redis servers start although a port picked for them is taken before
they bind it (as the source port of an outbound connection, or another server), and a
server that exits while starting fails the start at once, naming why."""

from __future__ import annotations

import socket
import stat
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support import servers
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_start import ATTEMPTS, StartFailed
from tests.support.sentinels import SentinelGroup
from tests.support.servers import RedisServer, redis_binary, valkey_binary

pytestmark = pytest.mark.e2e


@contextmanager
def taken(*ports: int) -> Iterator[None]:
    """Each of ``ports`` held by a listening socket of ours for the block."""
    with ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def own_pid(client: Any) -> int:
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["redis", "tls", "valkey"])
def test_a_server_whose_port_is_taken_starts_on_another(tmp_path: Path, kind: str) -> None:
    binary = valkey_binary() if kind == "valkey" else redis_binary()
    server = RedisServer(binary, "pw", tls=servers.TestCA(tmp_path) if kind == "tls" else None)
    busy = server.port
    with taken(busy), server.running():
        assert server.port != busy
        assert f":{server.port}/" in server.url
        assert own_pid(server.client()) == server.process.pid
        assert redis.Redis.from_url(server.url, password="pw", **_tls(server)).ping()


def _tls(server: RedisServer) -> dict[str, Any]:
    return {"ssl_ca_certs": str(server.tls.ca)} if server.tls else {}


def test_a_server_does_not_take_another_server_on_its_port_for_itself() -> None:
    """A port taken by another redis-server: that one answers PING on it, but the start
    goes on to a port of its own."""
    with RedisServer(redis_binary()).running() as other:
        server = RedisServer(redis_binary())
        server.port = other.port
        with server.running():
            assert server.port != other.port
            assert own_pid(server.client()) == server.process.pid


def test_a_restart_keeps_the_port() -> None:
    with RedisServer(redis_binary()).running() as server:
        port = server.port
        server.stop()
        server.start()
        assert server.port == port


def test_a_cluster_whose_ports_are_taken_starts_on_others(tmp_path: Path) -> None:
    cluster = RedisCluster(redis_binary(), tmp_path, password="pw")
    busy = {cluster.ports[1], cluster.bus_ports[2]}
    with taken(*busy):
        cluster.start()
        try:
            assert busy.isdisjoint(cluster.ports + cluster.bus_ports)
            for url, process in zip(cluster.node_urls, cluster.processes, strict=True):
                assert own_pid(redis.Redis.from_url(url)) == process.pid
            assert all(f"127.0.0.1:{p}" in cluster.url for p in cluster.ports)
            client = redis.RedisCluster("127.0.0.1", cluster.ports[0], password="pw")
            try:
                assert client.set("k", "v")
                assert client.get("k") == b"v"
            finally:
                client.close()
        finally:
            cluster.stop()


@pytest.mark.parametrize("which", ["replica", "sentinel"])
def test_a_sentinel_group_whose_port_is_taken_starts_on_others(tmp_path: Path, which: str) -> None:
    group = SentinelGroup(redis_binary(), tmp_path, "data-pw", "sentinel-pw")
    busy = group.nodes[1].port if which == "replica" else group.sentinel_ports[2]
    with taken(busy):
        try:
            group.start()
            ports = [node.port for node in group.nodes] + group.sentinel_ports
            assert busy not in ports
            hosts = ",".join(f"127.0.0.1:{port}" for port in group.sentinel_ports)
            assert f"@{hosts}/" in group.url
            for index, process in enumerate(group.sentinels):
                assert own_pid(group.sentinel(index)) == process.pid
            assert group.primary() is group.nodes[0]
        finally:
            group.stop()


def fake_server(tmp_path: Path, says: str) -> Path:
    """A "server" that notes its arguments in ``runs``, says ``says`` and exits 3."""
    script = tmp_path / "fake-server"
    script.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "runs"}\necho "{says}" >&2\nexit 3\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def starting(kind: str, binary: Path, tmp_path: Path) -> tuple[Any, set[int]]:
    """``kind``'s start, and the ports its first attempt starts processes on."""
    if kind == "server":
        server = RedisServer(str(binary))
        return server.start, {server.port}
    if kind == "cluster":
        cluster = RedisCluster(str(binary), tmp_path)
        return cluster.start, set(cluster.ports)
    group = SentinelGroup(str(binary), tmp_path)
    return group.start, {node.port for node in group.nodes}


def ports_run(tmp_path: Path) -> list[int]:
    """The ``--port`` of each start of the fake server."""
    runs = (tmp_path / "runs").read_text().splitlines()
    return [int(run.split("--port ")[1].split()[0]) for run in runs]


@pytest.mark.parametrize("kind", ["server", "cluster", "sentinel"])
def test_a_server_that_exits_at_once_fails_the_start_at_once(tmp_path: Path, kind: str) -> None:
    binary = fake_server(tmp_path, "FATAL CONFIG FILE ERROR (Redis 7.0.15)")
    start, first_ports = starting(kind, binary, tmp_path)
    began = time.monotonic()
    with pytest.raises(StartFailed, match=r"(?s)exit 3.*FATAL CONFIG FILE ERROR") as failed:
        start()
    # At once: not at a start deadline (a minute: time for a busy machine).
    assert time.monotonic() - began < 15
    assert not failed.value.port_in_use
    assert set(ports_run(tmp_path)) <= first_ports  # not tried again on fresh ports


def test_a_port_taken_every_time_fails_after_a_few_tries(tmp_path: Path) -> None:
    says = (
        "# Could not create server TCP listening socket 127.0.0.1:1: bind: Address already in use"
    )
    start, _ = starting("server", fake_server(tmp_path, says), tmp_path)
    began = time.monotonic()
    with pytest.raises(StartFailed, match="Address already in use"):
        start()
    assert time.monotonic() - began < 15
    ports = ports_run(tmp_path)
    assert len(ports) == ATTEMPTS
    assert len(set(ports)) == ATTEMPTS  # fresh ones each time
