"""Issue 26 item 3 end to end: per-tenant policy. Two tenants (two API keys) on one proxy
behave per their ``tenants:`` entries (the ``openai`` SDK, over HTTP, in front of the
simulator); a rewrite of the config file, or SIGHUP, changes the policy of every worker
of a 2-worker proxy without a restart, and a bad one keeps the policy in force.
Matching, validation and the caps' counts: tests/test_tenant_policy.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from proxy.config import Settings
from proxy.core.session import tenant_from_headers
from tests.support.chat import (
    FILLER,
    Chat,
    assert_forwarded_as_sent,
    recording_chat,
    small_window_settings,
    upstream_requests,
)
from tests.support.metrics import metric
from tests.support.processes import CHAT, Served, chats_by_worker, serve_process

SIM_WINDOW = 65536  # the simulator's: histories sent whole never overflow it
OFF_KEY, CAPPED_KEY, RELOAD_KEY = "sk-tenant-off", "sk-tenant-capped", "sk-tenant-reload"
ADMIN_KEY = "admin-key-for-tests"
TURNS = 36


def tenant_id(key: str) -> str:
    """The id ``GET /admin/tenants`` shows for ``key``."""
    return tenant_from_headers({"authorization": f"Bearer {key}"})[:12]


def _summaries_for(sim: str, key: str) -> int:
    return sum(
        1
        for r in upstream_requests(sim)
        if r["headers"].get("x-compaction-purpose") == "summarize"
        and r["headers"].get("authorization") == f"Bearer {key}"
    )


def test_two_tenants_on_one_proxy_each_get_their_policy(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """One tenant's compaction is off: every request forwarded as the client sent it, no
    summary. The other's trigger is low and it may have one summary an hour: its first
    crossing is summarized, the later ones trimmed instead, said and counted."""
    tenants = [
        {"id": tenant_id(OFF_KEY), "enabled": False},
        {
            "label": "capped-agents",
            "ids": [tenant_id(CAPPED_KEY)],
            "trigger_ratio": 0.5,
            "target_ratio": 0.3,
            "summaries_per_hour": 1,
        },
    ]
    base = small_window_settings(sim_reset).model_dump()
    base["server"]["admin_key"] = ADMIN_KEY
    url = start_proxy(Settings.model_validate({**base, "tenants": tenants}))
    off, sent = recording_chat(url, "off", {}, SIM_WINDOW, key=OFF_KEY)
    capped = Chat(url, key=CAPPED_KEY, session="capped", window=SIM_WINDOW)
    seen, whole = [], []  # the capped tenant's headers; the off one's history sizes
    summaries_after_first: int | None = None
    for turn in range(TURNS):  # the two conversations interleaved on one proxy
        off.say(f"Turn {turn}: {FILLER}")
        assert off.last is not None
        whole.append(int(off.last["x-context-tokens"]))
        capped.say(f"Turn {turn}: {FILLER}")
        assert capped.last is not None
        seen.append(capped.last)
        if capped.last["x-compaction-status"] == "compacted" and summaries_after_first is None:
            summaries_after_first = _summaries_for(sim_reset, CAPPED_KEY)
    # Off: forwarded untouched, though its history passed the proxy's 4k window.
    assert off.statuses == {"passthrough": TURNS}
    assert whole[-1] > 4096
    assert_forwarded_as_sent(sim_reset, sent)
    assert _summaries_for(sim_reset, OFF_KEY) == 0
    # Capped: one summary, then trimmed at every crossing, naming the cap.
    statuses = [h["x-compaction-status"] for h in seen]
    assert statuses.count("compacted") == 1
    first = statuses.index("compacted")
    # Its low trigger: the same history size (the off tenant's) is far below the default's.
    assert whole[first] < 0.8 * 4096 - 256 - 400
    degraded = [h.get("x-compaction-degraded") for h in seen]
    capped_turns = [i for i, d in enumerate(degraded) if d == "summaries_per_hour"]
    assert len(capped_turns) >= 3
    assert min(capped_turns) > first
    # Trimmed instead, to the trigger: every turn from the first past it (on one cut
    # while that fits: sticky.py), never past the trigger.
    assert capped_turns == list(range(capped_turns[0], TURNS))
    assert {statuses[i] for i in capped_turns} == {"trimmed"}
    assert all(int(seen[i]["x-context-tokens"]) + 256 <= 0.5 * 4096 for i in capped_turns)
    assert _summaries_for(sim_reset, CAPPED_KEY) == summaries_after_first  # none since
    reason = {"reason": "summaries_per_hour"}
    assert metric(url, "compaction_proxy_tenant_capped", **reason) == len(capped_turns)
    assert metric(url, "compaction_proxy_degraded_requests", **reason) == len(capped_turns)
    # The admin API names each tenant's entry.
    admin = httpx.get(f"{url}/admin/tenants", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    policies = {t["tenant"]: t.get("policy") for t in admin.json()["data"]}
    assert policies == {
        tenant_id(OFF_KEY): tenant_id(OFF_KEY),
        tenant_id(CAPPED_KEY): "capped-agents",
    }


# -- reload on a 2-worker proxy -------------------------------------------------------


def _config(simulator: str, mode: str, poll_s: float) -> dict[str, Any]:
    return {
        "upstream": {"base_url": f"{simulator}/v1"},
        "server": {"workers": 2, "reload_poll_s": poll_s},
        "tenants": [{"id": tenant_id(RELOAD_KEY), "mode": mode}],
    }


def _statuses(url: str, count: int) -> set[str]:
    """``X-Compaction-Status`` of ``count`` requests, each from a new SDK client on a
    new connection (so the kernel spreads them over the workers)."""
    seen = set()
    for _ in range(count):
        with openai.OpenAI(base_url=f"{url}/v1", api_key=RELOAD_KEY, max_retries=0) as client:
            raw = client.chat.completions.with_raw_response.create(**CHAT)
            seen.add(raw.headers["x-compaction-status"])
    return seen


def _reloads(url: str, outcome: str, expected: float) -> float:
    """``config_reloads_total{outcome}`` over the workers once it is ``expected`` (bounded)."""
    deadline = time.monotonic() + 15
    name = "compaction_proxy_config_reloads"
    while (value := metric(url, name, outcome=outcome)) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def _on_every_worker(served: Served, mode_status: str, count: int = 24) -> None:
    """``count`` requests all answered per the policy (``mode_status``), by both workers."""
    before = chats_by_worker(served)
    assert _statuses(served.url, count) == {mode_status}
    after = chats_by_worker(served)
    assert len(after) == 2
    served_by = [pid for pid in after if after[pid] > before.get(pid, 0)]
    assert len(served_by) == 2, f"one worker served all {count}: {after}"


def _write(path: Path, config: dict[str, Any]) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump(config))
    os.replace(tmp, path)  # as editors and Kubernetes do: a new file in its place


def test_a_file_change_reloads_every_worker_and_a_bad_one_keeps_the_policy(
    tmp_path: Path, simulator: str
) -> None:
    with serve_process(tmp_path, _config(simulator, "off", 0.2)) as served:
        _on_every_worker(served, "passthrough")
        _write(served.config_path, _config(simulator, "shadow", 0.2))
        assert _reloads(served.url, "applied", 2) == 2  # one per worker
        _on_every_worker(served, "shadow")
        bad = _config(simulator, "off", 0.2)
        bad["tenants"][0]["trigger_ratio"] = 2  # out of bounds: the whole reload refused
        _write(served.config_path, bad)
        assert _reloads(served.url, "invalid", 2) == 2
        _on_every_worker(served, "shadow")
        assert served.log().count("rejected, tenants policy kept") == 2
        assert metric(served.url, "compaction_proxy_config_reloads", outcome="applied") == 2


def test_an_emptied_file_keeps_the_policy_on_every_worker(tmp_path: Path, simulator: str) -> None:
    """A file truncated before it is written (an editor, ``> file``) and caught by the poll,
    empty or comment-only, is refused while entries are in force (counted invalid, logged):
    the shadow tenant stays in shadow and the capped one stays capped."""
    config = _config(simulator, "shadow", 0.2)
    config["models"] = [{"match": "sim-4k", "context_window": 4096, "max_output_tokens": 256}]
    config["compaction"] = {"summary_max_tokens": 400, "precompact_ratio": None}
    config["tenants"].append({"id": tenant_id(CAPPED_KEY), "summaries_per_hour": 0})
    with serve_process(tmp_path, config) as served:
        _on_every_worker(served, "shadow")
        served.config_path.write_text("")  # truncated in place, as `> file` does
        deadline = time.monotonic() + 15  # read by both workers, whatever they made of it
        while sum(_reloads(served.url, o, 0) for o in ("applied", "invalid")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        _on_every_worker(served, "shadow")
        assert _reloads(served.url, "invalid", 2) == 2  # one per worker
        capped = Chat(served.url, key=CAPPED_KEY, session="capped", window=4096)
        degraded = []
        for turn in range(40):  # bounded: the 4k window is crossed within a dozen turns
            capped.say(f"Turn {turn}: {FILLER}")
            assert capped.last is not None
            degraded.append(capped.last.get("x-compaction-degraded"))
            if degraded[-1] == "summaries_per_hour":
                break
        assert "summaries_per_hour" in degraded  # due a summary, refused by its cap
        assert capped.statuses["compacted"] == 0
        assert capped.statuses["trimmed"] >= 1
        served.config_path.write_text("# being rewritten\n")
        assert _reloads(served.url, "invalid", 4) == 4
        _on_every_worker(served, "shadow")
        assert served.log().count("sets no tenants") == 4
        assert metric(served.url, "compaction_proxy_config_reloads", outcome="applied") == 0


def test_sighup_to_the_supervisor_reloads_every_worker(tmp_path: Path, simulator: str) -> None:
    with serve_process(tmp_path, _config(simulator, "off", 0)) as served:
        _on_every_worker(served, "passthrough")  # both up (a later one reads the file)
        _write(served.config_path, _config(simulator, "shadow", 0))
        time.sleep(1)
        _on_every_worker(served, "passthrough")  # no polling: unchanged until told
        os.kill(served.process.pid, signal.SIGHUP)
        assert _reloads(served.url, "applied", 2) == 2
        _on_every_worker(served, "shadow")
        assert served.process.poll() is None


def test_sighup_reloads_a_single_process(tmp_path: Path, simulator: str) -> None:
    config = _config(simulator, "off", 0)
    config["server"]["workers"] = 1
    with serve_process(tmp_path, config) as served:
        assert _statuses(served.url, 2) == {"passthrough"}
        config["tenants"][0]["mode"] = "shadow"
        _write(served.config_path, config)
        os.kill(served.process.pid, signal.SIGHUP)
        assert _reloads(served.url, "applied", 1) == 1
        assert _statuses(served.url, 2) == {"shadow"}
        assert served.process.poll() is None
