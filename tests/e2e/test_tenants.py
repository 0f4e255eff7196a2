"""One tenant cannot touch another: learned windows and keyless callers (issue 14, items 2-3)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from hashlib import blake2b
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.chat import FILLER, Chat, chat_requests
from tests.support.servers import proxy_settings

CONFIGURED = 32768
REAL = 6144  # what the simulator enforces when asked to
MODEL = "sim-big"


def settings(sim: str, **compaction: Any) -> Any:
    return proxy_settings(
        sim,
        models=[{"match": MODEL, "context_window": CONFIGURED, "max_output_tokens": 256}],
        compaction=compaction,
    )


def post(url: str, key: str | None, messages: list[dict[str, Any]], **headers: str) -> Any:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages},
        headers=headers,
        timeout=30,
    )


def hello() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hello " * 200}]


def too_long_for_real_window() -> list[dict[str, Any]]:
    # ~8k tokens: over the simulator's real 6k, far below the configured 32k's trigger,
    # so the proxy forwards it as is and the upstream's overflow error teaches the window.
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 400}
        for i in range(20)
    ]
    return [*turns, {"role": "user", "content": "and now?"}]


def window_of(response: Any) -> int:
    return int(response.headers["x-context-window"])


def shared_gauge(url: str) -> float | None:
    metrics = httpx.get(f"{url}/metrics").text
    found = re.search(rf'compaction_proxy_learned_window_tokens{{model="{MODEL}"}} (\S+)', metrics)
    return float(found.group(1)) if found else None


@pytest.mark.parametrize(
    "role",
    [
        "maximum context length is 1 tokens",
        # The client's \\u escapes are decoded by the upstream before it echoes them.
        "m\\u0061ximum context length is 1 tokens",
        # Digits of another script: int() reads them, no provider writes them.
        "maximum context length is \u0661\u0662 tokens",
    ],
)
def test_an_echoed_limit_changes_no_other_tenants_window(
    sim_reset: str, start_proxy: Callable[..., str], role: str
) -> None:
    """The simulator, like OpenAI, quotes an invalid role back in its 400."""
    url = start_proxy(settings(sim_reset, learned_window_quorum=1))
    # Built by hand so the role's JSON escapes reach the proxy as the client wrote them.
    body = '{"model": "' + MODEL + '", "messages": [{"role": "' + role + '", "content": "hi"}]}'
    attack = httpx.post(
        f"{url}/v1/chat/completions",
        content=body.encode(),
        headers={"Authorization": "Bearer attacker", "content-type": "application/json"},
    )
    assert attack.status_code == 400
    assert "Invalid value" in attack.json()["error"]["message"]
    for key in ("victim-1", "victim-2"):
        r = post(url, key, hello())
        assert r.status_code == 200, r.text
        assert window_of(r) >= CONFIGURED * 0.9
    assert shared_gauge(url) is None


def test_a_tenant_learns_its_own_window_at_once_and_everyone_only_on_a_quorum(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset))  # quorum 2, one lowering per 600 s, at most half
    real = {"X-Sim-Context-Window": str(REAL)}

    first = post(url, "tenant-a", too_long_for_real_window(), **real)
    assert first.status_code == 200, first.text  # recovered: trimmed and retried once
    assert window_of(first) <= REAL
    assert window_of(post(url, "tenant-a", hello(), **real)) <= REAL
    # One tenant's report moves nobody else's window.
    assert window_of(post(url, "tenant-b", hello(), **real)) >= CONFIGURED * 0.9
    assert shared_gauge(url) is None

    second = post(url, "tenant-b", too_long_for_real_window(), **real)
    assert second.status_code == 200, second.text
    # Two tenants agree: the shared window drops, but by at most half at a time.
    assert shared_gauge(url) == CONFIGURED // 2
    c = post(url, "tenant-c", hello(), **real)
    assert REAL * 1.5 < window_of(c) <= CONFIGURED // 2

    third = post(url, "tenant-c", too_long_for_real_window(), **real)
    assert third.status_code == 200, third.text
    # A third report within the interval lowers nothing further.
    assert shared_gauge(url) == CONFIGURED // 2
    assert window_of(post(url, "tenant-d", hello(), **real)) > REAL * 1.5


def test_a_bare_413_teaches_only_the_tenant_that_hit_it(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset, learned_window_quorum=1))
    gateway = {"X-Sim-Context-Window": str(REAL), "X-Sim-Error-Format": "gateway413"}
    assert post(url, "tenant-a", too_long_for_real_window(), **gateway).status_code == 200
    assert window_of(post(url, "tenant-a", hello(), **gateway)) < CONFIGURED // 2
    assert window_of(post(url, "tenant-b", hello(), **gateway)) >= CONFIGURED * 0.9
    assert shared_gauge(url) is None


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/v1/chat/completions", "POST"),
        ("/v1/models", "GET"),
        ("/sessions/shared-id", "GET"),
        ("/sessions/shared-id", "DELETE"),
        ("/sessions/shared-id/compact", "POST"),
    ],
)
@pytest.mark.parametrize("authorization", [None, "", "Bearer"])
def test_keyless_callers_are_refused_when_the_proxy_holds_the_key(
    sim_reset: str,
    start_proxy: Callable[..., str],
    path: str,
    method: str,
    authorization: str | None,
) -> None:
    url = start_proxy(proxy_settings(sim_reset, upstream={"api_key": "sk-proxy-own"}))
    headers = {"X-Session-Id": "shared-id"}
    if authorization is not None:
        headers["Authorization"] = authorization
    body = {"model": MODEL, "messages": hello()} if path.endswith("completions") else None
    r = httpx.request(method, f"{url}{path}", json=body, headers=headers)
    assert r.status_code == 401
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "missing_api_key"
    assert chat_requests(sim_reset) == []
    assert httpx.get(f"{sim_reset}/_sim/requests").json() == []


def test_keyless_callers_no_longer_share_a_session(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Before: a second keyless caller read and deleted the first one's session."""
    url = start_proxy(
        proxy_settings(
            sim_reset,
            upstream={"api_key": "sk-proxy-own"},
            models=[{"match": "sim-4k", "context_window": 4096, "max_output_tokens": 256}],
            compaction={"summary_max_tokens": 400, "precompact_ratio": None},
        )
    )
    chat = Chat(url, key="owner-key", session="s1")
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}")
        if chat.statuses["compacted"]:
            break
    assert chat.statuses["compacted"]
    owner = {"Authorization": "Bearer owner-key"}
    assert httpx.get(f"{url}/sessions/s1", headers=owner).status_code == 200
    assert httpx.get(f"{url}/sessions/s1").status_code == 401
    assert httpx.delete(f"{url}/sessions/s1").status_code == 401
    assert httpx.get(f"{url}/sessions/s1", headers=owner).status_code == 200


def test_keyless_callers_are_served_when_explicitly_allowed(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        proxy_settings(
            sim_reset, upstream={"api_key": "sk-proxy-own"}, server={"require_client_key": False}
        )
    )
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": hello()})
    assert r.status_code == 200
    assert chat_requests(sim_reset)[-1]["headers"]["authorization"] == "Bearer sk-proxy-own"


def test_keyless_callers_pass_when_the_upstream_needs_no_key(proxy: str) -> None:
    """No proxy key: nothing to borrow, so the default does not require one."""
    r = httpx.post(f"{proxy}/v1/chat/completions", json={"model": MODEL, "messages": hello()})
    assert r.status_code == 200


def test_requests_that_miscount_cannot_vote_the_shared_window_down(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Parts the proxy counts as a few tokens and the upstream as many (here 450 file
    parts) make an honest overflow at the configured window look, scaled to the proxy's
    count, like a window of ~1.5k. Two made-up keys must not share that with everyone."""
    url = start_proxy(settings(sim_reset))
    parts = [{"type": "file"} for _ in range(450)]
    for key in ("sybil-1", "sybil-2"):
        messages = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "y"},
            {"role": "user", "content": parts},
        ]
        post(url, key, messages, **{"X-Sim-Context-Window": str(CONFIGURED)})
    assert shared_gauge(url) is None
    assert window_of(post(url, "victim", hello())) >= CONFIGURED * 0.9


def test_one_callers_skewed_counts_do_not_recalibrate_anyone_else(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset))
    before = window_of(post(url, "victim", hello()))
    parts = [{"type": "file"} for _ in range(100)]
    body = orjson.dumps(
        {"model": MODEL, "max_tokens": 4096, "messages": [{"role": "user", "content": parts}]}
    )
    # Padding past the far-below fast path, so the request is counted and calibrated.
    body = body[:-1] + b" " * 25_000 + b"}"
    attacker = httpx.post(
        f"{url}/v1/chat/completions",
        content=body,
        headers={"Authorization": "Bearer attacker", "content-type": "application/json"},
    )
    assert attacker.status_code == 200
    assert window_of(post(url, "attacker", hello())) < before  # its own counts: its own window
    assert window_of(post(url, "victim", hello())) == before


# -- tenant ids are keyed by the deployment ---------------------------------------------

ADMIN = "admin-key-for-tenant-ids"
GUESSABLE = "sk-alice"  # a caller's key an attacker can guess (lent-key setups choose them)
SECRETS = ("deployment-one-secret-0123456789", "deployment-two-secret-0123456789")


def _from_source(key: str) -> str:
    """The id anyone computes for ``key`` from the source: blake2b under the constant
    written there (every id before server.tenant_id_secret)."""
    joined = f"authorization:Bearer {key}"
    return blake2b(joined.encode(), key=b"compaction-proxy/tenant/v1", digest_size=16).hexdigest()


def _admin_tenants(url: str) -> dict[str, str | None]:
    """``GET /admin/tenants``: each shown id and the entry it falls under."""
    answer = httpx.get(f"{url}/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"})
    return {t["tenant"]: t.get("policy") for t in answer.json()["data"]}


def _served_status(url: str, key: str) -> str:
    answer = post(url, key, hello())
    assert answer.status_code == 200, answer.text
    return str(answer.headers["x-compaction-status"])


def test_two_deployments_with_different_secrets_give_one_key_different_ids(
    sim_reset: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Neither id is the one the source computes, so a guessed key cannot be confirmed
    against /admin/tenants (or a log line); a tenants: entry naming the old id still
    matches its tenant while the deployment migrates, and the log says its id now."""
    legacy = _from_source(GUESSABLE)[:12]
    urls = [
        start_proxy(
            proxy_settings(
                sim_reset,
                server={"tenant_id_secret": secret, "admin_key": ADMIN},
                tenants=[{"id": legacy, "mode": "shadow"}],
            )
        )
        for secret in SECRETS
    ]
    caplog.set_level(logging.WARNING, logger="proxy.tenants")
    shown = []
    for url in urls:
        assert _served_status(url, GUESSABLE) == "shadow"  # the old id's entry still applies
        assert _served_status(url, "sk-bob") == "passthrough"  # and only to its tenant
        tenants = _admin_tenants(url)
        (mine,) = [t for t, policy in tenants.items() if policy == legacy]
        assert mine != legacy
        shown.append(mine)
    assert shown[0] != shown[1]
    warnings = [r.getMessage() for r in caplog.records if r.name == "proxy.tenants"]
    assert len(warnings) == 2  # once a deployment, not once a request
    for mine, warning in zip(shown, warnings, strict=True):
        assert f"legacy id; its id is now {mine}" in warning
        assert legacy not in warning


def test_a_flood_of_long_keys_leaves_a_legacy_id_entry_matching_its_tenant(
    sim_reset: str, start_proxy: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client sending more distinct long (uncached) keys than the legacy ids kept
    cannot push out a cached tenant's legacy id: the tenants: entry naming it still
    applies (legacy ids kept cut to 20 so the flood stays short)."""
    from proxy.core import tenant_ids

    monkeypatch.setattr(tenant_ids, "LEGACY_LIMIT", 20)
    legacy = _from_source(GUESSABLE)[:12]
    url = start_proxy(
        proxy_settings(
            sim_reset,
            server={"tenant_id_secret": SECRETS[0]},
            tenants=[{"id": legacy, "mode": "shadow"}],
        )
    )
    assert _served_status(url, GUESSABLE) == "shadow"
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(30):  # each its own tenant, a body refused: no upstream call
            key = f"sk-flood-{i:04d}-" + "k" * 1100
            answer = client.post(
                "/v1/chat/completions", json={}, headers={"Authorization": f"Bearer {key}"}
            )
            assert answer.status_code == 400, answer.text
    assert _served_status(url, GUESSABLE) == "shadow"  # still its entry's


def test_a_lent_keys_deployment_without_a_secret_is_keyed_by_its_upstream_key(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """The setup where callers' keys are the operator's to choose (so guessable): with
    no tenant_id_secret, ids derive from upstream.api_key, never the source's constant."""
    url = start_proxy(
        proxy_settings(sim_reset, upstream={"api_key": "sk-proxy-own"}, server={"admin_key": ADMIN})
    )
    assert _served_status(url, GUESSABLE) == "passthrough"
    (shown,) = _admin_tenants(url)
    assert shown != _from_source(GUESSABLE)[:12]


def test_the_cli_prints_the_id_the_deployment_shows(
    sim_reset: str, start_proxy: Callable[..., str], tmp_path: Path
) -> None:
    """``compaction-proxy tenant-id`` keys by the deployment's secret, from its config file
    or the environment (PROXY_SERVER__TENANT_ID_SECRET)."""
    secret = SECRETS[0]
    url = start_proxy(
        proxy_settings(sim_reset, server={"tenant_id_secret": secret, "admin_key": ADMIN})
    )
    _served_status(url, GUESSABLE)
    (shown,) = _admin_tenants(url)
    config = tmp_path / "config.yaml"
    config.write_text(f"server: {{tenant_id_secret: {secret}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    command = [sys.executable, "-m", "proxy", "tenant-id"]
    for args, extra in (
        ([], {"PROXY_SERVER__TENANT_ID_SECRET": secret}),
        (["--config", str(config)], {}),
    ):
        done = subprocess.run(
            [*command, *args],
            input=f"{GUESSABLE}\n",
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=60,
            check=True,
        )
        assert done.stdout == f"{shown}\n"
        assert "server.tenant_id_secret" in done.stderr
    legacy = subprocess.run(
        command,
        input=f"{GUESSABLE}\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert legacy.stdout == f"{_from_source(GUESSABLE)[:12]}\n"  # no secret: said so
    assert "legacy" in legacy.stderr
