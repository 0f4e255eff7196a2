"""Issue 21, honest signals: what a turn reports when it was slowed by something the
proxy did, and counts that come out no lower than the server's.

End to end: the real proxy under uvicorn, httpx and the openai SDK as clients, and as
upstream ``tests/faulty_upstream.py`` (a summarizer that fails after a delay) or the
project's simulator (a single-slot server; a server counting tools as a chat template
renders them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import proxy_settings, run_proxy
from tests.faulty_upstream import FaultyUpstream, answer, completion
from tests.test_precompact import metric

pytestmark = pytest.mark.e2e

MODEL = "m-4k"
FILLER = "please keep careful notes about the project as we go along. " * 6  # ~75 tokens
FAILING_SUMMARY_S = 0.4


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    with FaultyUpstream() as up:
        yield up


def _history(turns: int, newest: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"turn {turn}: {FILLER}"})
        history.append({"role": "assistant", "content": f"ok {turn}"})
    return [*history, {"role": "user", "content": newest}]


def _post(url: str, newest: str) -> httpx.Response:
    # 44 turns of ~80 tokens: past the 4k window's trigger (80%) yet within the window,
    # so the fallback after a failed summary is the history as sent (passthrough).
    body = {"model": MODEL, "messages": _history(44, newest), "max_tokens": 64}
    headers = {"Authorization": "Bearer sk-signals", "X-Session-Id": "degraded"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_a_turn_that_spent_time_in_a_failed_summary_says_so(
    upstream: FaultyUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """It reported plain ``passthrough`` after the time of a failed summary; now it says
    ``X-Compaction-Degraded: summary_failed`` (the status still says what the upstream
    saw), is counted, and its line carries the seconds; the next turn, backed off, says
    ``backoff`` and asks nothing."""
    upstream.summary = answer(500, b'{"error": {"message": "boom"}}', delay_s=FAILING_SUMMARY_S)
    upstream.chat = answer(body=completion("fine"))
    upstream.seen.clear()
    settings = proxy_settings(
        upstream.url,
        models=[{"match": MODEL, "context_window": 4096, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None},
    )
    with run_proxy(settings) as url, caplog.at_level(logging.INFO, logger="proxy.access"):
        first = _post(url, "the newest question")
        assert first.status_code == 200, first.text
        assert upstream.requests(summaries=True), "no summary was asked for"
        assert first.headers["x-compaction-status"] == "passthrough"
        assert first.headers["x-compaction-degraded"] == "summary_failed"

        asked = len(upstream.requests(summaries=True))
        second = _post(url, "and again")
        assert second.status_code == 200, second.text
        assert second.headers["x-compaction-status"] == "passthrough"
        assert second.headers["x-compaction-degraded"] == "backoff"
        assert len(upstream.requests(summaries=True)) == asked  # backed off: not asked

        name = "compaction_proxy_degraded_requests"
        assert metric(url, name, reason="summary_failed") == 1
        assert metric(url, name, reason="backoff") == 1
        spent = metric(url, "compaction_proxy_failed_summary_seconds")
        assert spent >= FAILING_SUMMARY_S
        compactions = "compaction_proxy_compactions"
        assert metric(url, compactions, outcome="failed", trigger="threshold") == 1
        assert metric(url, compactions, outcome="passthrough", trigger="threshold") == 0
        plain = _post_plain(url)
        assert "x-compaction-degraded" not in plain.headers

    lines = [r.fields for r in caplog.records if r.name == "proxy.access"]  # type: ignore[attr-defined]
    assert lines[0]["degraded"] == "summary_failed"
    assert lines[0]["summary_failed_ms"] >= FAILING_SUMMARY_S * 1000
    assert lines[1]["degraded"] == "backoff"
    assert "summary_failed_ms" not in lines[1]
    assert "degraded" not in lines[2]


def _post_plain(url: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    headers = {"Authorization": "Bearer sk-signals"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)
