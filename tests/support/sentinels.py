"""A Redis primary, its replica and three sentinels on loopback, for the Sentinel tests
(tests/conftest.py's ``sentinel_group`` fixtures)."""

from __future__ import annotations

import time
from typing import Any

from tests.support.redis_start import LoggedProcess, free_ports, wait_serving, with_fresh_ports
from tests.support.servers import RedisServer, TestCA, check_server_allowed


class SentinelGroup:
    """A primary, its replica and three sentinels on loopback (``redis-server --sentinel``),
    failing over in about a second; each process started here is killed by ``stop``.

    ``url`` is the proxy's ``redis+sentinel://`` store URL: ``password`` (the data
    nodes' requirepass) in its userinfo, ``sentinel_password`` (the sentinels' own)
    as a query parameter; with ``tls`` set, ``rediss+sentinel://``, every process
    listening with TLS only.
    """

    SERVICE = "cp-test"

    def __init__(
        self,
        binary: str,
        workdir: Any,
        password: str = "",
        sentinel_password: str = "",
        tls: TestCA | None = None,
    ) -> None:
        self.binary = binary
        self.tls = tls
        self.workdir = workdir  # a pathlib.Path: the sentinels rewrite their config files
        self.password = password
        self.sentinel_password = sentinel_password
        self.nodes = [RedisServer(binary, password, (), tls) for _ in range(2)]
        self.sentinel_ports: list[int] = []
        self.sentinels: list[LoggedProcess] = []
        self._pick_ports()

    def _pick_ports(self) -> None:
        """Fresh ports for every process, and the nodes' options that name them."""
        ports = free_ports(len(self.nodes) + 3)
        # A replica syncs at once (the default waits 5 s for more replicas to join).
        args = ["--repl-diskless-sync-delay", "0"]
        args += ["--masterauth", self.password] if self.password else []
        for node, port in zip(self.nodes, ports, strict=False):
            node.port = port  # a replica writes what it syncs to disk: not to the cwd
            node.args = [*args, "--dir", str(self.workdir), "--dbfilename", f"node-{port}.rdb"]
        self.nodes[1].args += ["--replicaof", "127.0.0.1", str(self.nodes[0].port)]
        self.sentinel_ports = ports[len(self.nodes) :]

    @property
    def url(self) -> str:
        userinfo = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        query = [f"sentinel_password={self.sentinel_password}"] if self.sentinel_password else []
        query += [f"ssl_ca_certs={self.tls.ca}"] if self.tls else []
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return (
            f"{scheme}://{userinfo}{hosts}/{self.SERVICE}/0{'?' if query else ''}{'&'.join(query)}"
        )

    def _config(self, port: int) -> str:
        lines = [f"port {port}"]
        if self.tls:
            lines = ["port 0", f"tls-port {port}", "tls-auth-clients no", "tls-replication yes"]
            tls = self.tls
            lines += [f"tls-cert-file {tls.cert}", f"tls-key-file {tls.key}"]
            lines += [f"tls-ca-cert-file {tls.ca}"]
        lines += [
            "bind 127.0.0.1",
            f"dir {self.workdir}",
            f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.nodes[0].port} 2",
            f"sentinel down-after-milliseconds {self.SERVICE} 1000",
            f"sentinel failover-timeout {self.SERVICE} 3000",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {self.SERVICE} {self.password}")
        if self.sentinel_password:
            lines += [f"requirepass {self.sentinel_password}"]
            lines += [f"sentinel sentinel-pass {self.sentinel_password}"]
        return "\n".join(lines) + "\n"

    def start(self, *, converged: bool = False, timeout_s: float = 60.0) -> None:
        """Start every process (on fresh ports while one is taken); wait until the
        sentinels see the replica in sync (and, ``converged``, each other, so a failover
        is agreed on at once). Read ``url`` and the ports once started."""
        check_server_allowed()

        def attempt(n: int) -> None:
            if n:
                self._pick_ports()
            self._start_processes()

        with_fresh_ports(attempt, self.stop)
        self._wait(lambda: self._ready(converged), timeout_s, "sentinels did not see the replica")

    def _start_processes(self) -> None:
        for node in self.nodes:
            node.start_once()
        for port in self.sentinel_ports:
            path = self.workdir / f"sentinel-{port}.conf"
            path.write_text(self._config(port))
            self.sentinels.append(LoggedProcess([self.binary, str(path), "--sentinel"]))
        deadline = time.monotonic() + 60  # a busy machine: an answer is seen at once
        for index, process in enumerate(self.sentinels):
            what = f"sentinel on port {self.sentinel_ports[index]}"
            wait_serving(process, self.sentinel(index), deadline, what)

    def sentinel(self, index: int = 0) -> Any:
        import redis

        port = self.sentinel_ports[index]
        password = self.sentinel_password or None
        tls = self.tls.client_kwargs() if self.tls else {}
        return redis.Redis(
            "127.0.0.1", port, password=password, socket_timeout=1, decode_responses=True, **tls
        )

    def _ask_each(self, ask: Any) -> list[Any]:
        import redis

        answers = []
        for index in range(len(self.sentinel_ports)):
            client = self.sentinel(index)
            try:
                answers.append(ask(client))
            except redis.RedisError:
                answers.append(None)
            finally:
                client.close()
        return answers

    def _ready(self, converged: bool) -> bool:
        def view(client: Any) -> bool:
            replicas = client.sentinel_slaves(self.SERVICE)
            synced = any(r.get("master-link-status") == "ok" for r in replicas)
            others = client.sentinel_master(self.SERVICE)["num-other-sentinels"]
            return bool(synced and (not converged or others == len(self.sentinel_ports) - 1))

        return all(self._ask_each(view))

    def primary(self) -> RedisServer:
        """The node every sentinel names as the primary now, and which says so itself."""

        def port(client: Any) -> int | None:
            addr = client.sentinel_get_master_addr_by_name(self.SERVICE)
            return int(addr[1]) if addr else None

        ports = set(self._ask_each(port))
        for node in self.nodes:
            if ports != {node.port}:
                continue
            client = node.client()
            try:
                if client.info("replication")["role"] == "master":
                    return node
            finally:
                client.close()
        raise LookupError(f"no agreed primary yet (sentinels name ports {ports})")

    def failover(self, *, settle: bool = True, timeout_s: float = 30.0) -> RedisServer:
        """``SENTINEL FAILOVER``; returns the new primary once the sentinels agree on it
        and it answers as a primary, and (``settle``) the old one replicates from it: the
        sentinels reconfigure it 8-20 s later, until then it is a primary nobody names."""

        old = self.primary()
        client = self.sentinel(0)
        try:
            client.execute_command("SENTINEL", "FAILOVER", self.SERVICE)
        finally:
            client.close()

        def settled() -> bool:
            try:
                new = self.primary()
            except LookupError:
                return False
            demoted = old.client()
            try:
                info = demoted.info("replication")
            finally:
                demoted.close()
            return new is not old and (not settle or info.get("master_link_status") == "up")

        self._wait(settled, timeout_s, "the failover did not settle")
        return self.primary()

    @staticmethod
    def _wait(done: Any, timeout_s: float, message: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(message)
            time.sleep(0.05)

    def stop_sentinels(self) -> None:
        for process in self.sentinels:
            process.stop()
        self.sentinels = []

    def stop(self) -> None:
        self.stop_sentinels()
        for node in self.nodes:
            node.stop()
