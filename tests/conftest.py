"""Shared fixtures: real servers under uvicorn on 127.0.0.1, in background threads.

Two tiers. A test that starts any server or process (the simulator, a proxy, Redis,
the CLI), or loads the machine for seconds, is end-to-end and carries the ``e2e``
marker: added here from the fixtures it uses (and for every ``redis`` test), or
written on the test when it starts one itself. ``pytest -m "not e2e"`` is the
fast tier, pure logic in-process; a test in it that tries to start a server fails,
so a missing marker cannot hide.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from hypothesis import settings

# Property tests run a fifth of their examples by default (the fast tier, a developer's
# loop); the whole suite (`scripts/test` without arguments, so CI) passes
# --hypothesis-profile=thorough for all of them. Test modules read the loaded profile
# through examples() when they are imported, after pytest_configure has chosen it.
settings.register_profile("fast", max_examples=20)
settings.register_profile("thorough", max_examples=100)


def pytest_configure(config: pytest.Config) -> None:
    # Not at import: test modules import this file again as tests.conftest.
    if not config.getoption("--hypothesis-profile"):
        settings.load_profile("fast")


def examples(thorough: int) -> int:
    """How many examples a property runs: ``thorough`` under the thorough profile."""
    return max(10, thorough * settings.default.max_examples // 100)


# Fixtures that start servers: any test that uses them, directly or not, is e2e.
_SERVER_FIXTURES = frozenset(
    {
        "simulator",
        "sim_reset",
        "start_proxy",
        "proxy",
        "redis_server",
        "spawn_proxy",
        "spawn_proxy_process",
        "server_runner",
    }
)
_servers_allowed = True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_server = _SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses_server or item.get_closest_marker("redis") is not None:
            item.add_marker(pytest.mark.e2e)


# HTTP clients a test helper opened (tests.test_compaction.Chat): closed after each
# test, so their pooled sockets are not left for a later test's garbage collection.
OPEN_CLIENTS: list[Any] = []


@pytest.fixture(autouse=True)
def _close_helper_clients() -> Iterator[None]:
    yield
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    global _servers_allowed
    _servers_allowed = request.node.get_closest_marker("e2e") is not None
    yield
    _servers_allowed = True


def _check_server_allowed() -> None:
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
    _check_server_allowed()
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


@pytest.fixture(scope="session")
def server_runner() -> Callable[[Any], Any]:
    return run_server


@pytest.fixture(scope="session")
def simulator() -> Iterator[str]:
    """The project's own upstream simulator, shared by the session; yields its base URL."""
    from proxy.simulator import create_simulator_app, load_simulator_config

    with run_server(create_simulator_app(load_simulator_config(None))) as url:
        yield url


@pytest.fixture
def sim_reset(simulator: str) -> str:
    """The simulator with its recorded requests and counters cleared."""
    import httpx

    httpx.delete(f"{simulator}/_sim/requests")
    return simulator


def proxy_settings(upstream_url: str, **sections: Any) -> Any:
    from proxy.config import Settings

    sections.setdefault("upstream", {})
    sections["upstream"] = {"base_url": f"{upstream_url}/v1", **sections["upstream"]}
    return Settings(**sections)


@pytest.fixture
def start_proxy() -> Iterator[Callable[..., str]]:
    """Start a real proxy under uvicorn; call with Settings, get its base URL."""
    from contextlib import ExitStack

    with ExitStack() as stack:

        def start(settings: Any) -> str:
            return stack.enter_context(run_proxy(settings))

        yield start


@pytest.fixture
def proxy(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    """A proxy with default settings in front of the simulator."""
    return start_proxy(proxy_settings(sim_reset))


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

        _check_server_allowed()
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


def _redis_binary() -> str:
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


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server per test, killed afterwards."""
    server = RedisServer(_redis_binary())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def spawn_proxy(
    spawn_proxy_process: Callable[[dict[str, Any]], tuple[str, Any]],
) -> Callable[[dict[str, Any]], str]:
    """Start `compaction-proxy serve` as its own process from a config dict."""
    return lambda config: spawn_proxy_process(config)[0]


@pytest.fixture
def spawn_proxy_process(tmp_path: Any) -> Iterator[Callable[[dict[str, Any]], tuple[str, Any]]]:
    """Like spawn_proxy, and also hands back the `subprocess.Popen` (to signal it)."""
    import subprocess
    import sys

    import httpx
    import yaml

    processes: list[Any] = []

    def spawn(config: dict[str, Any]) -> tuple[str, Any]:
        _check_server_allowed()
        port = free_port()
        path = tmp_path / f"proxy-{port}.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path)]
        process = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return url, process
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"proxy process did not start (exit {process.poll()})")
            time.sleep(0.1)

    try:
        yield spawn
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
