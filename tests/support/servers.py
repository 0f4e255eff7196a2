"""Servers a test starts on 127.0.0.1: the helpers tests/conftest.py's fixtures use, and
tests import (``from tests.support.servers import run_server``).

One module holds the state both share: the fast tier's guard (``allow_servers``, set by
conftest for each test) and the HTTP clients a helper opened (``OPEN_CLIENTS``, closed by
conftest after each test). Kept out of conftest.py, which pytest imports as ``conftest``:
a test importing ``tests.conftest`` got a second copy of that state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

# HTTP clients a test helper opened (tests.support.chat.Chat): closed after each test,
# so their pooled sockets are not left for a later test's garbage collection.
OPEN_CLIENTS: list[Any] = []
_servers_allowed = True


def allow_servers(allowed: bool) -> None:
    """conftest, around each test: may it start a server (is it marked e2e)?"""
    global _servers_allowed
    _servers_allowed = allowed


def check_server_allowed() -> None:
    if not _servers_allowed:
        pytest.fail("this test starts a server: mark it @pytest.mark.e2e")


class _QuietServer(uvicorn.Server):
    # The test process owns signal handling; a server in a thread must not.
    def install_signal_handlers(self) -> None:
        pass


@contextmanager
def run_server(app: Any) -> Iterator[str]:
    """Serve ``app`` on a free loopback port; yields ``http://127.0.0.1:PORT``."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        loop="asyncio",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )
    with _run_config(config) as url:
        yield url


@contextmanager
def run_proxy(settings: Any, app: Any = None) -> Iterator[str]:
    """Serve the proxy as production does (proxy.serve.server's protocol and limits);
    ``app``: the proxy's app wrapped by the test (default: ``create_app(settings)``)."""
    from proxy.serve.server import uvicorn_config

    config = uvicorn_config(settings, app, host="127.0.0.1", port=0, log_level="warning")
    with _run_config(config) as url:
        yield url


@contextmanager
def _run_config(config: uvicorn.Config) -> Iterator[str]:
    check_server_allowed()
    server = _QuietServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def proxy_settings(upstream_url: str, **sections: Any) -> Any:
    from proxy.config import Settings

    sections.setdefault("upstream", {})
    sections["upstream"] = {"base_url": f"{upstream_url}/v1", **sections["upstream"]}
    return Settings(**sections)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real redis-server on loopback that a test may stop and start again."""

    def __init__(self, binary: str, password: str = "") -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.password = password  # requirepass: clients must AUTH with it
        self.process: Any = None

    def start(self) -> None:
        import subprocess

        check_server_allowed()
        import redis

        args = ["--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            [self.binary, *args, "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_timeout=0.5, password=self.password or None)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


def redis_binary() -> str:
    import os
    import shutil

    binary = shutil.which("redis-server")
    if binary:
        return binary
    if os.environ.get("CI"):
        pytest.fail(
            "redis-server is not installed; .ci/run installs it (apt-get install redis-server)"
        )
    pytest.skip("redis-server not installed: `apt-get install redis-server` to run Redis tests")


class RedisCluster:
    """A real 3-primary Redis Cluster on loopback (``redis-server --cluster-enabled yes``
    x3, joined by ``redis-cli --cluster create``), killed by PID on ``stop``.

    ``url`` is the proxy's ``redis+cluster://`` URL naming every node; ``node_urls``
    each node's plain ``redis://`` URL. With ``tls``, nodes speak TLS only (clients and
    the cluster bus, a throwaway CA: tests.support.tls) and the URLs are ``rediss``
    ones naming the CA; with ``password``, nodes require it and the URLs carry it.
    """

    PRIMARIES = 3

    def __init__(
        self,
        binary: str,
        workdir: Any,
        full_coverage: bool = True,
        password: str = "",
        tls: bool = False,
    ) -> None:
        from pathlib import Path

        from tests.support.tls import make_certs

        self.binary = binary
        self.workdir = workdir
        # no: the nodes still up keep serving their slots while one is down.
        self.full_coverage = full_coverage
        self.password = password
        self.certs = make_certs(Path(workdir)) if tls else None
        self.ports = [free_port() for _ in range(self.PRIMARIES)]
        # Each node's cluster bus: its own free port (the default, port + 10000, may be
        # past 65535 or taken).
        self.bus_ports = [free_port() for _ in range(self.PRIMARIES)]
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        scheme = "rediss" if tls else "redis"
        auth = f":{password}@" if password else ""
        query = f"?ssl_ca_certs={self.certs.ca}" if self.certs else ""
        self.url = f"{scheme}+cluster://{auth}{nodes}{query}"
        self.node_urls = [f"{scheme}://{auth}127.0.0.1:{p}/0{query}" for p in self.ports]
        self.processes: list[Any] = []

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the nodes and join them; on any failure, what was started is killed."""
        check_server_allowed()
        try:
            self._start(time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, deadline: float) -> None:
        import shutil
        import subprocess

        for port, bus in zip(self.ports, self.bus_ports, strict=True):
            args = ["--bind", "127.0.0.1", "--save", "", *self._listen(port)]
            args += ["--appendonly", "no", "--protected-mode", "yes", "--dir", str(self.workdir)]
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
            args += ["--cluster-port", str(bus), "--cluster-node-timeout", "2000"]
            args += ["--cluster-require-full-coverage", "yes" if self.full_coverage else "no"]
            self.processes.append(
                subprocess.Popen(
                    [self.binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        for url in self.node_urls:
            _wait_for_ping(url, deadline)
        cli = [shutil.which("redis-cli") or "redis-cli"]
        if self.certs:
            cli += ["--tls", "--cacert", str(self.certs.ca)]
        if self.password:
            cli += ["-a", self.password, "--no-auth-warning"]
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [*cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=max(deadline - time.monotonic(), 1),
        )
        self._wait_until_ok(deadline)

    def _listen(self, port: int) -> list[str]:
        """A node's arguments for its port, TLS and password."""
        args = ["--port", str(port)]
        if self.certs:
            args = ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes"]
            args += ["--tls-cert-file", str(self.certs.cert), "--tls-key-file", str(self.certs.key)]
            args += ["--tls-ca-cert-file", str(self.certs.ca), "--tls-auth-clients", "no"]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        return args

    def _wait_until_ok(self, deadline: float) -> None:
        """Every node says ``cluster_state:ok`` and knows every other one."""
        import redis

        for url in self.node_urls:
            client = redis.Redis.from_url(url, socket_timeout=0.5)
            try:
                while True:
                    info = client.execute_command("CLUSTER", "INFO").decode()
                    known = f"cluster_known_nodes:{self.PRIMARIES}" in info
                    if "cluster_state:ok" in info and known:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"redis cluster did not become ok: {info[:200]}")
                    time.sleep(0.05)
            finally:
                client.close()

    def flush(self) -> None:
        """Every primary emptied (a fixture's reset between tests sharing the cluster)."""
        import redis

        for url in self.node_urls:
            client = redis.Redis.from_url(url, socket_timeout=2)
            try:
                client.flushall()
            finally:
                client.close()

    def kill_node(self, index: int) -> None:
        """Kill one node (by PID), as a crashed primary."""
        self.processes[index].kill()
        self.processes[index].wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait(timeout=10)
        self.processes = []


def _wait_for_ping(url: str, deadline: float) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=0.5)
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
    finally:
        client.close()
