"""Issue 23 item 5: secrets fail closed and stay secret.

With ``store.require_encryption`` no snapshot is read or written in plaintext, and a
remote store without keys refuses to start; a store URL is never shown with its
password (check-config, a configuration error, a log line); ``check-config --store``
fails when the store cannot be reached or written to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from proxy.core.session import SessionKey
from proxy.observe.metrics import Metrics
from proxy.store.redis import RedisOptions, RedisStore
from tests.support.processes import cli, serve_process, write_config
from tests.support.servers import RedisServer, free_port, redis_binary
from tests.support.snapshots import snap

PASSWORD = "hunter2-store-secret"
KEY = "tenant:h:plain"


def fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


@pytest.mark.redis
async def test_require_encryption_reads_no_plaintext_and_writes_none(
    redis_server: RedisServer,
) -> None:
    key = SessionKey("tenant", "plain", "header")
    raw = redis.Redis.from_url(redis_server.url)
    plain = RedisStore(redis_server.url, ttl_s=60)
    metrics = Metrics.create()
    options = RedisOptions(encryption_keys=[fernet_key()], require_encryption=True)
    strict = RedisStore(redis_server.url, ttl_s=60, options=options, metrics=metrics)
    try:
        assert await plain.save(key, snap(1, "FACT pet=otter"))  # before keys were set
        assert await strict.load(key) is None  # unreadable: counted, and not used
        unreadable = metrics.snapshots_unreadable.labels(kind="snapshot")._value.get()
        assert unreadable == 1
        assert await strict.save(key, snap(1, "FACT pet=otter"))
        stored = raw.hget(f"cp:snap:{KEY}", "d")
        assert stored is not None
        assert b"otter" not in stored
        loaded = await strict.load(key)
        assert loaded is not None
        assert loaded.summary == "FACT pet=otter"
    finally:
        raw.close()
        await plain.aclose()
        await strict.aclose()


def test_require_encryption_without_keys_refuses_a_remote_store(tmp_path: Path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    path = write_config(tmp_path, {"store": {"url": url, "require_encryption": True}})
    for command in (["check-config", path], ["serve", "--config", path]):
        out = cli(*command)
        assert out.returncode == 2, out.stderr
        assert "require_encryption" in out.stderr
        assert "Traceback" not in out.stderr
        assert PASSWORD not in out.stderr + out.stdout
    # The embedded store keeps nothing outside the process: nothing to encrypt.
    path = write_config(tmp_path, {"store": {"url": "memory://", "require_encryption": True}})
    assert cli("check-config", path).returncode == 0


def test_a_mistyped_scheme_is_refused_without_echoing_the_password(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"store": {"url": f"redsi://app:{PASSWORD}@redis:6379/0"}})
    for command in (["check-config", path], ["serve", "--config", path]):
        out = cli(*command)
        assert out.returncode == 2
        assert "redsi://app:***@redis:6379/0" in out.stderr
        assert PASSWORD not in out.stderr + out.stdout


def test_check_config_store_fails_when_the_store_is_unreachable(tmp_path: Path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0?password={PASSWORD}"
    path = write_config(tmp_path, {"store": {"url": url}})
    shown = cli("check-config", path, "--no-store")  # the table alone, and exit 0
    assert shown.returncode == 0, shown.stderr
    assert "not contacted (--no-store)" in shown.stdout
    for command in (["check-config", path], ["check-config", path, "--store"]):
        checked = cli(*command)
        assert checked.returncode == 1, checked.stdout
        assert "unreachable" in checked.stderr
        for out in (shown, checked):
            assert PASSWORD not in out.stdout + out.stderr
            assert "redis://:***@127.0.0.1:" in out.stdout + out.stderr


@pytest.mark.redis
def test_check_config_store_writes_to_a_reachable_store(tmp_path: Path) -> None:
    with RedisServer(redis_binary(), password=PASSWORD).running() as server:
        good = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
        out = cli("check-config", write_config(tmp_path, {"store": {"url": good}}), "--store")
        assert out.returncode == 0, out.stderr
        assert "takes writes" in out.stdout
        assert PASSWORD not in out.stdout + out.stderr
        # The right address, the wrong password: reachable, but not usable.
        wrong = f"redis://:not-{PASSWORD}@127.0.0.1:{server.port}/0"
        out = cli("check-config", write_config(tmp_path, {"store": {"url": wrong}}), "--store")
        assert out.returncode == 1
        client = redis.Redis(port=server.port, password=PASSWORD)
        try:
            assert client.keys("*") == []  # the test write took its key away again
            # An ACL user that may touch only its deployment's keys: the test write goes
            # under store.prefix, as serving's do, and fails outside it.
            client.acl_setuser(
                "app", enabled=True, passwords=["+app-pw"], keys=["app:*"], commands=["+@all"]
            )
        finally:
            client.close()
        scoped = f"redis://app:app-pw@127.0.0.1:{server.port}/0"
        config: dict[str, Any] = {"store": {"url": scoped, "prefix": "app"}}
        out = cli("check-config", write_config(tmp_path, config), "--store")
        assert out.returncode == 0, out.stderr
        config["store"]["prefix"] = "other"
        out = cli("check-config", write_config(tmp_path, config), "--store")
        assert out.returncode == 1
        assert "app-pw" not in out.stdout + out.stderr


@pytest.mark.redis
def test_a_remote_store_without_keys_is_warned_about_once(sim_reset: str, tmp_path: Path) -> None:
    with RedisServer(redis_binary(), password=PASSWORD).running() as server:
        url = f"redis://default:{PASSWORD}@127.0.0.1:{server.port}/0?password={PASSWORD}"
        config: dict[str, Any] = {
            "upstream": {"base_url": f"{sim_reset}/v1"},
            "store": {"url": url},
        }
        with serve_process(tmp_path, config) as served:
            served.process.terminate()
            assert served.wait(timeout=30) == 0
        log = served.log()
        assert log.count("has no store.encryption_keys") == 1, log
        assert PASSWORD not in log
        assert "redis://default:***@127.0.0.1" in log
        config["store"]["encryption_keys"] = [fernet_key()]
        with serve_process(tmp_path, config) as served:
            served.process.terminate()
            assert served.wait(timeout=30) == 0
        assert "encryption_keys" not in served.log()
