"""A real 3-primary Redis Cluster on loopback, for the Cluster tests (tests/conftest.py's
``redis_cluster`` fixtures, tests/e2e/test_redis_cluster.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.support.redis_start import LoggedProcess, free_ports, wait_serving, with_fresh_ports
from tests.support.servers import TestCA, check_server_allowed


class RedisCluster:
    """A real 3-primary Redis Cluster on loopback (``redis-server --cluster-enabled yes``
    x3, joined by ``redis-cli --cluster create``), killed by PID on ``stop``; with
    ``replicas``, that many replicas of each primary too (``primaries`` says which nodes
    are primaries now).

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
        replicas: int = 0,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        # no: the nodes still up keep serving their slots while one is down.
        self.full_coverage = full_coverage
        self.password = password
        self.replicas = replicas
        self.nodes = self.PRIMARIES * (1 + replicas)
        self.certs = TestCA(Path(workdir)) if tls else None
        self.ports: list[int] = []
        # Each node's cluster bus: its own free port (the default, port + 10000, may be
        # past 65535 or taken).
        self.bus_ports: list[int] = []
        self._pick_ports()
        self.processes: list[LoggedProcess] = []

    def _pick_ports(self) -> None:
        ports = free_ports(2 * self.nodes)
        self.ports, self.bus_ports = ports[: self.nodes], ports[self.nodes :]

    def _urls(self) -> tuple[str, str, str]:
        scheme = "rediss" if self.certs else "redis"
        auth = f":{self.password}@" if self.password else ""
        query = f"?ssl_ca_certs={self.certs.ca}" if self.certs else ""
        return scheme, auth, query

    @property
    def url(self) -> str:
        scheme, auth, query = self._urls()
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"{scheme}+cluster://{auth}{nodes}{query}"

    @property
    def node_urls(self) -> list[str]:
        scheme, auth, query = self._urls()
        return [f"{scheme}://{auth}127.0.0.1:{p}/0{query}" for p in self.ports]

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the nodes (on fresh ports while one is taken) and join them; on any
        failure, what was started is killed. Read ``url``, ``node_urls`` and the ports
        once started."""
        check_server_allowed()
        deadline = time.monotonic() + timeout_s

        def attempt(n: int) -> None:
            if n:
                self._pick_ports()
            self._start(deadline)

        with_fresh_ports(attempt, self.stop)

    def _start(self, deadline: float) -> None:
        import shutil
        import subprocess

        import redis

        for port, bus in zip(self.ports, self.bus_ports, strict=True):
            config = f"nodes-{port}.conf"  # a fresh node: not one an earlier attempt left
            (Path(self.workdir) / config).unlink(missing_ok=True)
            args = ["--bind", "127.0.0.1", "--save", "", *self._listen(port)]
            args += ["--appendonly", "no", "--protected-mode", "yes", "--dir", str(self.workdir)]
            args += ["--cluster-enabled", "yes", "--cluster-config-file", config]
            args += ["--cluster-port", str(bus), "--cluster-node-timeout", "2000"]
            args += ["--cluster-require-full-coverage", "yes" if self.full_coverage else "no"]
            self.processes.append(LoggedProcess([self.binary, *args]))
        for port, url, process in zip(self.ports, self.node_urls, self.processes, strict=True):
            client = redis.Redis.from_url(url, socket_timeout=0.5)
            wait_serving(process, client, deadline, f"cluster node on port {port}")
        cli = [shutil.which("redis-cli") or "redis-cli"]
        if self.certs:
            cli += ["--tls", "--cacert", str(self.certs.ca)]
        if self.password:
            cli += ["-a", self.password, "--no-auth-warning"]
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        joined = subprocess.run(
            [
                *cli,
                "--cluster",
                "create",
                *nodes,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=max(deadline - time.monotonic(), 1),
        )
        if joined.returncode:
            output = (joined.stdout + joined.stderr)[-1200:]
            raise RuntimeError(f"redis-cli --cluster create exited {joined.returncode}:\n{output}")
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
        """Every node says ``cluster_state:ok`` and knows every other one; every replica
        is in sync with its primary."""
        import redis

        for url in self.node_urls:
            client = redis.Redis.from_url(url, socket_timeout=0.5)
            try:
                while True:
                    info = client.execute_command("CLUSTER", "INFO").decode()
                    known = f"cluster_known_nodes:{self.nodes}" in info
                    role = client.info("replication")
                    synced = role["role"] == "master" or role.get("master_link_status") == "up"
                    if "cluster_state:ok" in info and known and synced:
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

    def primaries(self) -> list[int]:
        """The indexes (in ``ports``, ``node_urls``) of the nodes that are primaries now."""
        import redis

        found = []
        for i, url in enumerate(self.node_urls):
            # A busy machine may take seconds to answer; redis-py's TimeoutError is no
            # ConnectionError.
            client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
            try:
                if client.execute_command("ROLE")[0] == b"master":
                    found.append(i)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # killed, or not answering: not serving as a primary now
            finally:
                client.close()
        return found

    def kill_node(self, index: int) -> None:
        """Kill one node (by PID), as a crashed primary."""
        self.processes[index].stop()

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.stop()
        self.processes = []
