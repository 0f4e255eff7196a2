"""Fairness and cost (issue 20, items 10-12), end to end: the real proxy under uvicorn,
the simulator as upstream, clients over real HTTP.

- 10: one tenant cannot hold every background summary slot while another waits;
- 11: one tenant's flood of sessions never evicts another tenant's session record;
- 12: the summary work a client can buy is bounded: POST /sessions/{id}/compact is
  rate-limited, a summarizer that keeps failing is backed off per session, and one
  compaction spends at most ``compaction.max_summary_calls`` summarizer calls.

The in-process decisions: tests/compaction/test_fairness.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats, upstream_requests
from tests.support.metrics import metric, wait_for_idle
from tests.support.precompaction import (
    over_soft_threshold,
)
from tests.support.servers import RedisServer, proxy_settings, run_server


def _post(url: str, key: str, session: str, content: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sim-4k", "messages": [{"role": "user", "content": content}]},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )


def test_one_tenants_flood_of_sessions_keeps_another_tenants_session_record(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Item 11: a session not compacted yet is known by its sighting alone; a flood of
    another tenant's new sessions must not push it out (it did: a 404)."""
    settings = proxy_settings(sim_reset, store={"max_sessions": 20, "max_sessions_per_tenant": 5})
    _flood_and_check(start_proxy(settings), per_tenant_bound=True)


@pytest.mark.redis
def test_redis_keeps_every_tenants_session_records_until_their_ttl(
    sim_reset: str, start_proxy: Callable[..., str], redis_server: RedisServer
) -> None:
    """Redis bounds sightings by TTL (store.ttl_s), not by count: a flood evicts nothing
    (only a maxmemory eviction policy of Redis's own could)."""
    store = {"url": redis_server.url, "max_sessions": 20, "max_sessions_per_tenant": 5}
    _flood_and_check(start_proxy(proxy_settings(sim_reset, store=store)), per_tenant_bound=False)


def _flood_and_check(url: str, *, per_tenant_bound: bool) -> None:
    assert _post(url, "sk-tenant-b", "b-kept", "hello").status_code == 200
    for i in range(40):
        assert _post(url, "sk-tenant-a", f"a-flood-{i}", "hello").status_code == 200
    b = {"Authorization": "Bearer sk-tenant-b"}
    a = {"Authorization": "Bearer sk-tenant-a"}
    kept = httpx.get(f"{url}/sessions/b-kept", headers=b)
    assert kept.status_code == 200, kept.text
    assert kept.json()["version"] == 0
    assert kept.json()["messages"] == 1
    # The flooder keeps its own newest, and (bounded in memory) loses its own oldest.
    assert httpx.get(f"{url}/sessions/a-flood-39", headers=a).status_code == 200
    oldest = httpx.get(f"{url}/sessions/a-flood-0", headers=a).status_code
    assert oldest == (404 if per_tenant_bound else 200)


SLOW_SUMMARY_MS = 2000


@pytest.fixture
def slow_summaries() -> Iterator[str]:
    """A simulator answering chats at once and summaries in SLOW_SUMMARY_MS."""
    config = SimulatorConfig(
        summary_latency_ms=SLOW_SUMMARY_MS,
        models=(ModelRule(match="sim-4k", context_window=WINDOW),),
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def _chat(url: str, key: str, session: str, messages: list[dict[str, Any]]) -> httpx.Response:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sim-4k", "messages": messages},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def _wait_until(check: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_one_tenant_cannot_hold_every_background_slot_while_another_waits(
    slow_summaries: str, start_proxy: Callable[..., str]
) -> None:
    """Tenant A's two sessions take both slots first; tenant B's session then crosses the
    soft threshold: its pre-compaction still runs (it was skipped), so B's turn past the
    trigger is served from a snapshot instead of waiting on a summary."""
    url = start_proxy(
        small_window_settings(slow_summaries, precompact_ratio=0.6, precompact_concurrency=2)
    )
    running = "compaction_proxy_precompactions_running"
    for session in ("a-1", "a-2"):
        _chat(url, "sk-tenant-a", session, over_soft_threshold(session))
    _wait_until(lambda: metric(url, running) == 2)
    b_history = over_soft_threshold("b-1")
    first = _chat(url, "sk-tenant-b", "b-1", b_history)
    tokens = int(first.headers["x-context-tokens"])
    assert WINDOW * 0.6 < tokens + 256 < WINDOW * 0.8
    wait_for_idle(url)
    assert metric(url, "compaction_proxy_precompactions", outcome="skipped_cap") == 0
    assert metric(url, "compaction_proxy_precompactions", outcome="preempted") == 1
    assert metric(url, "compaction_proxy_precompactions", outcome="compacted") == 2
    b = httpx.get(f"{url}/sessions/b-1", headers={"Authorization": "Bearer sk-tenant-b"})
    assert b.json()["version"] >= 1, b.json()

    # B's next turns carry it past the trigger: served from its snapshot, no summary waited.
    per_pair = tokens / 28
    pairs = int((WINDOW * 0.8 - 256 - tokens) / per_pair) + 2
    newer = [
        {"role": role, "content": f"b-1 later {i}: {FILLER}" if role == "user" else "ok"}
        for i in range(pairs)
        for role in ("user", "assistant")
    ]
    later = [*b_history[:-1], *newer, b_history[-1]]
    turn = _chat(url, "sk-tenant-b", "b-1", later)
    assert turn.headers["x-compaction-status"] == "snapshot"
    # It neither summarized nor waited for a summary (each counted): no slow summary in it.
    assert metric(url, "compaction_proxy_inline_summary_waits") == 0
    wait_for_idle(url)


def test_post_compact_is_rate_limited_like_the_force_header(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    # The interval outlasts the refused requests on a busy machine (a 1.5 s one did not).
    interval = 6.0
    url = start_proxy(small_window_settings(sim_reset, force_interval_s=interval))
    chat = Chat(url, key="sk-buyer", session="bought")
    auth = {"Authorization": "Bearer sk-buyer"}
    chat.say("FACT plan=b")
    chat.headers["X-Compaction"] = "force"
    chat.say("compact now")  # a first snapshot: there is something to schedule
    del chat.headers["X-Compaction"]
    compact = f"{url}/sessions/bought/compact"
    assert httpx.post(compact, headers=auth).status_code == 202
    bought = time.monotonic()
    summaries = stats(sim_reset)["summaries"]
    refused = [httpx.post(compact, headers=auth) for _ in range(5)]
    assert time.monotonic() - bought < interval, "the requests outlasted the interval"
    for r in refused:
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert 1 <= int(r.headers["retry-after"]) <= interval
    # Another tenant's same id is its own session (none here), never limited by this one.
    other = httpx.post(compact, headers={"Authorization": "Bearer sk-other"})
    assert other.status_code == 404
    chat.say("next turn")
    chat.say("and the one after")
    assert stats(sim_reset)["summaries"] == summaries + 1  # one summary bought, not six
    time.sleep(max(0.0, bought + interval + 0.1 - time.monotonic()))
    assert httpx.post(compact, headers=auth).status_code == 202


@pytest.fixture
def cut_off_summaries() -> Iterator[str]:
    """A simulator whose summarizer writes facts last and is always cut off: its
    budget (``summarizer_max_output_tokens`` below) is smaller than the facts alone."""
    config = SimulatorConfig(
        models=(
            ModelRule(match="sim-4k", context_window=WINDOW),
            ModelRule(match="cut-off", context_window=WINDOW, summary_style="realistic"),
        )
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def _summary_calls(sim: str) -> int:
    return sum(
        1 for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") == "summarize"
    )


def test_a_summarizer_always_cut_off_is_backed_off_per_session(
    cut_off_summaries: str, start_proxy: Callable[..., str]
) -> None:
    """Every turn past the trigger cost the cut-off call and its terser retry; now the
    first failure backs the session off: its turns are trimmed without asking."""
    settings = small_window_settings(
        cut_off_summaries,
        summarizer_model="cut-off",
        summarizer_max_output_tokens=24,
        summarizer_context_window=WINDOW,  # the simulator's window for "cut-off"
    )  # compaction.backoff.first_s: its default, 30 s, is longer than the test
    url = start_proxy(settings)
    chat = Chat(url, key="sk-cut", session="cut")
    for i in range(12):
        chat.say(f"FACT key{i}=value-{i}-{'x' * 40}")
    turn = 0
    while chat.statuses["trimmed"] == 0:
        chat.say(f"Turn {turn}: {FILLER}")
        turn += 1
        assert turn < 60
    calls = _summary_calls(cut_off_summaries)
    assert calls == 2  # the cut-off answer and its terser retry
    backed_off = metric(url, "compaction_proxy_compactions", outcome="backoff")
    for more in range(8):
        chat.say(f"More {more}: {FILLER}")
        assert chat.last is not None
        assert chat.last["x-compaction-status"] == "trimmed"
    assert _summary_calls(cut_off_summaries) == calls  # nothing asked while backing off
    assert metric(url, "compaction_proxy_compactions", outcome="backoff") == backed_off + 8
    assert metric(url, "compaction_proxy_summaries_truncated") == 1
    # Another session of the same tenant is not backed off by this one's failures.
    other = Chat(url, key="sk-cut", session="other")
    other.history = [*chat.history]
    other.say("and here?")
    assert _summary_calls(cut_off_summaries) == calls + 2


def test_one_compaction_spends_at_most_max_summary_calls(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """A summarizer window far smaller than the span (1,024 tokens for a 4k model's
    history here; 4,096 for 800k tokens in the probe: 383 calls) made one call per
    chunk, without bound. Now the oldest chunks are left out, marked."""
    settings = small_window_settings(sim_reset, summarizer_context_window=1024, max_summary_calls=4)
    url = start_proxy(settings)
    chat = Chat(url, key="sk-big", session="big")
    chat.history += [
        {"role": role, "content": f"FACT k{i}=v{i} {FILLER}" if role == "user" else "ok"}
        for i in range(80)
        for role in ("user", "assistant")
    ]
    chat.say("and now?")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    # The newest max_summary_calls - 1 chunks (a call spared for a retry, unused here).
    assert _summary_calls(sim_reset) == 3
    info = httpx.get(f"{url}/sessions/big", headers={"Authorization": "Bearer sk-big"}).json()
    assert info["summary"].startswith("[compaction-proxy: ")
    assert "earlier messages were omitted" in info["summary"].splitlines()[0]
    assert "FACT k0=v0" not in info["summary"]  # the oldest were left out...
    assert chat.say("RECALL k63") == "k63=v63"  # ...the newest summarized
