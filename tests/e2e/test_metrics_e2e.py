"""Issue 10: the series a dashboard needs move as the proxy works.

Real proxy under uvicorn, the openai SDK as client, the simulator as upstream; values
are read from a live ``/metrics`` scrape. In-process: tests/observe/test_metrics.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.core.session import SessionKey
from proxy.observe.metrics import Metrics
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.resilient import ResilientStore
from tests.support.chat import FILLER, WINDOW, small_window_settings
from tests.support.metrics import Samples, client, long_history
from tests.support.servers import RedisServer, proxy_settings
from tests.support.snapshots import snap


def scrape(url: str) -> Samples:
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def wait_for(url: str, name: str, expected: float, **labels: str) -> Samples:
    """A scrape where ``name`` reached ``expected`` (a stream is finished after its last
    byte reached the client, so its series move a moment later)."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(url)
        if value(samples, name, **labels) == expected or time.monotonic() > deadline:
            return samples
        time.sleep(0.02)


def test_a_threshold_compaction_moves_its_series(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(sim_reset))
    raw = client(url).chat.completions.with_raw_response.create(
        model="sim-4k",
        messages=long_history(50),  # ~3,700 tokens: past the 80% trigger of 4,096
        extra_headers={"X-Session-Id": "threshold", "X-Sim-Context-Window": str(WINDOW)},
    )
    assert raw.headers["x-compaction-status"] == "compacted"
    sent = int(raw.headers["x-context-tokens"])
    s = scrape(url)
    assert value(s, "compaction_proxy_compactions_total", trigger="threshold") == 1
    assert value(s, "compaction_proxy_compactions_total", outcome="compacted") == 1
    assert value(s, "compaction_proxy_chat_requests_total", status="compacted") == 1
    before = value(s, "compaction_proxy_input_tokens_total", stage="before")
    assert value(s, "compaction_proxy_input_tokens_total", stage="after") == sent
    assert before > 0.8 * WINDOW - 256 > sent
    summarized = value(s, "compaction_proxy_summarization_duration_seconds_sum", outcome="ok")
    assert value(s, "compaction_proxy_summarization_duration_seconds_count", outcome="ok") == 1
    chat = {"route": "chat"}
    assert value(s, "compaction_proxy_request_duration_seconds_count", **chat) == 1
    assert value(s, "compaction_proxy_upstream_duration_seconds_count", **chat) == 1
    assert value(s, "compaction_proxy_responses_total", **chat, status="2xx") == 1
    assert value(s, "compaction_proxy_upstream_responses_total", **chat, status="2xx") == 1
    # The summary ran before the chat call went upstream: it is the proxy's own time.
    added = value(s, "compaction_proxy_added_latency_seconds_sum", route="chat")
    assert added >= summarized > 0
    total = value(s, "compaction_proxy_request_duration_seconds_sum", **chat)
    upstream = value(s, "compaction_proxy_upstream_duration_seconds_sum", **chat)
    assert upstream > 0
    assert added == pytest.approx(total - upstream)


def test_forced_and_scheduled_compactions_count_by_trigger(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(sim_reset))
    sdk = client(url, key="sk-owner")
    history = long_history(10)  # far below the trigger: only an ask compacts it
    headers = {"X-Session-Id": "asked", "X-Sim-Context-Window": str(WINDOW)}
    forced = sdk.chat.completions.with_raw_response.create(
        model="sim-4k", messages=history, extra_headers={**headers, "X-Compaction": "force"}
    )
    assert forced.headers["x-compaction-status"] == "compacted"
    auth = {"Authorization": "Bearer sk-owner"}
    assert httpx.post(f"{url}/sessions/asked/compact", headers=auth).status_code == 202
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    scheduled = sdk.chat.completions.with_raw_response.create(
        model="sim-4k", messages=history, extra_headers=headers
    )
    assert scheduled.headers["x-compaction-status"] == "compacted"
    s = scrape(url)
    assert value(s, "compaction_proxy_compactions_total", trigger="forced") == 1
    assert value(s, "compaction_proxy_compactions_total", trigger="scheduled") == 1
    assert value(s, "compaction_proxy_compactions_total", trigger="threshold") == 0
    sessions = {"route": "sessions"}
    assert value(s, "compaction_proxy_request_duration_seconds_count", **sessions) == 1
    assert value(s, "compaction_proxy_responses_total", **sessions, status="2xx") == 1
    # The sessions API never calls the upstream.
    assert value(s, "compaction_proxy_upstream_duration_seconds_count", route="sessions") == 0


def test_an_overflow_recovery_counts_its_compaction_and_its_outcome(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    settings = proxy_settings(  # configured far above the simulator's real window
        sim_reset,
        models=[{"match": "sim-4k", "context_window": 32768, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400},
    )
    url = start_proxy(settings)
    raw = client(url).chat.completions.with_raw_response.create(
        model="sim-4k",
        messages=long_history(50),
        extra_headers={"X-Session-Id": "overflow", "X-Sim-Context-Window": "3000"},
    )
    assert raw.headers["x-compaction-status"] == "compacted"
    s = scrape(url)
    assert value(s, "compaction_proxy_compactions_total", trigger="overflow_recovery") == 1
    assert value(s, "compaction_proxy_upstream_overflows_total", outcome="recovered") == 1
    # One request, two chat calls upstream (rejected, then answered): timed as one request.
    chat = {"route": "chat"}
    assert value(s, "compaction_proxy_upstream_duration_seconds_count", **chat) == 1
    assert value(s, "compaction_proxy_upstream_responses_total", **chat, status="2xx") == 1
    summarized = value(s, "compaction_proxy_summarization_duration_seconds_sum")
    assert value(s, "compaction_proxy_added_latency_seconds_sum", route="chat") >= summarized


def test_a_stream_is_active_while_relayed_and_observes_its_time_to_first_byte(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    stream = client(url).chat.completions.create(
        model="sim-4k",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        extra_headers={"X-Sim-First-Byte-Delay-Ms": "200", "X-Sim-Chunk-Delay-Ms": "50"},
    )
    with stream:
        next(iter(stream))
        assert value(scrape(url), "compaction_proxy_active_streams") == 1
        chunks = sum(1 for _ in stream)
    assert chunks > 1
    s = wait_for(url, "compaction_proxy_active_streams", 0)
    assert value(s, "compaction_proxy_active_streams") == 0
    assert value(s, "compaction_proxy_stream_ttfb_seconds_count", route="chat") == 1
    ttfb = value(s, "compaction_proxy_stream_ttfb_seconds_sum", route="chat")
    total = value(s, "compaction_proxy_request_duration_seconds_sum", route="chat")
    assert 0.2 <= ttfb < total
    assert value(s, "compaction_proxy_chat_requests_total", status="passthrough") == 1


def test_a_client_that_leaves_mid_stream_ends_its_stream(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    body = {"model": "sim-4k", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": "Bearer sk-metrics", "X-Sim-Chunk-Delay-Ms": "300"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        chunks = r.iter_bytes()  # kept: a dropped iterator would close the stream now
        next(chunks)
        assert value(scrape(url), "compaction_proxy_active_streams") == 1
    s = wait_for(url, "compaction_proxy_active_streams", 0)
    assert value(s, "compaction_proxy_active_streams") == 0
    assert value(s, "compaction_proxy_request_duration_seconds_count", route="chat") == 1


def test_a_responses_request_is_recorded_under_its_route(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(sim_reset))
    items: list[dict[str, Any]] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: {FILLER}"}
        for i in range(10)
    ]
    items.append({"role": "user", "content": "and now?"})
    raw = client(url).responses.with_raw_response.create(
        model="sim-4k",
        input=items,  # plain dicts, as a client sends them
        store=False,
        extra_headers={"X-Compaction": "force", "X-Session-Id": "r", "X-Request-Id": "resp-1"},
    )
    assert raw.headers["x-compaction-status"] == "compacted"
    assert raw.headers["x-request-id"] == "resp-1"
    s = scrape(url)
    ok = {"route": "responses"}
    assert value(s, "compaction_proxy_responses_total", **ok, status="2xx") == 1
    assert value(s, "compaction_proxy_request_duration_seconds_count", **ok) == 1
    assert value(s, "compaction_proxy_upstream_duration_seconds_count", **ok) == 1
    assert value(s, "compaction_proxy_upstream_duration_seconds_sum", **ok) > 0
    assert value(s, "compaction_proxy_compactions_total", trigger="forced") == 1
    assert value(s, "compaction_proxy_chat_requests_total", status="compacted") == 1
    before = value(s, "compaction_proxy_input_tokens_total", stage="before")
    assert before > value(s, "compaction_proxy_input_tokens_total", stage="after") > 0
    forwarded = httpx.get(f"{sim_reset}/_sim/requests").json()
    assert {r["headers"]["x-request-id"] for r in forwarded} == {"resp-1"}


def test_passthrough_and_unknown_routes_are_timed_and_probes_are_not(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    auth = {"Authorization": "Bearer sk-metrics"}
    assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
    assert httpx.get(f"{url}/nowhere", headers=auth).status_code == 404
    for probe in ("/healthz", "/readyz", "/metrics"):
        httpx.get(f"{url}{probe}")
    s = scrape(url)
    passthrough = {"route": "passthrough"}
    assert value(s, "compaction_proxy_responses_total", **passthrough, status="2xx") == 1
    assert value(s, "compaction_proxy_request_duration_seconds_count", **passthrough) == 1
    assert value(s, "compaction_proxy_upstream_duration_seconds_count", **passthrough) == 1
    assert value(s, "compaction_proxy_added_latency_seconds_count", route="passthrough") == 1
    other = {"route": "other"}
    assert value(s, "compaction_proxy_responses_total", **other, status="4xx") == 1
    assert value(s, "compaction_proxy_request_duration_seconds_count", **other) == 1
    assert value(s, "compaction_proxy_request_duration_seconds_count") == 2


async def test_store_calls_are_timed_by_operation_failures_included(
    redis_server: RedisServer,
) -> None:
    metrics = Metrics.create()
    store = ResilientStore(RedisStore(redis_server.url, ttl_s=60), MemoryStore(ttl_s=60), metrics)
    key = SessionKey("tenant", "session", "header")
    registry = metrics.registry

    def timed(operation: str) -> float:
        labels = {"operation": operation}
        return registry.get_sample_value("compaction_proxy_store_duration_seconds_count", labels)

    try:
        assert await store.save(key, snap(1))
        assert await store.load(key) is not None
        token = await store.acquire(key, 5)
        assert token is not None
        await store.release(key, token)
        assert (timed("save"), timed("load"), timed("acquire"), timed("release")) == (1, 1, 1, 1)
        redis_server.stop()
        await store.load(key)  # fails over to local state
        assert timed("load") == 2
        errors = registry.get_sample_value(
            "compaction_proxy_store_errors_total", {"operation": "load"}
        )
        assert errors == 1
    finally:
        await store.aclose()
