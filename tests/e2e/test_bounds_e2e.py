"""Issue 20, items 1-3, end to end: ever-new long names leave a real proxy's memory where
it was, a request line copies a bounded amount of any client value, and ``/metrics``
stays a few hundred series whatever clients and upstreams send. The caps in-process:
tests/observe/test_bounds.py.
"""

from __future__ import annotations

import random
import re
import string
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.observe.recorder import LOGGED_VALUE_CHARS
from tests.support.chat import HELLO
from tests.support.faulty_upstream import completion
from tests.support.processes import serve_process
from tests.support.servers import proxy_settings, run_server


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def _unique(size: int, i: int) -> str:
    # Distinct from its first bytes, so no table could share a prefix's storage.
    return f"{i:08d}-" + random.choice(string.ascii_letters) * (size - 9)


@pytest.mark.e2e
def test_ever_new_long_names_leave_the_proxys_memory_where_it_was(
    tmp_path: Path, sim_reset: str
) -> None:
    """200 distinct 1 MB model names and 200 distinct 64 KB session names (measured on
    the unfixed proxy: +2.9 MB per model name, kept for good)."""
    config = {"upstream": {"base_url": f"{sim_reset}/v1"}, "logging": {"level": "warning"}}
    url = "/v1/chat/completions"
    with serve_process(tmp_path, config) as served, httpx.Client(base_url=served.url) as client:
        pid = served.process.pid

        def models(start: int, count: int) -> list[httpx.Response]:
            return [
                client.post(url, json={"model": _unique(1 << 20, i), "messages": HELLO})
                for i in range(start, start + count)
            ]

        def sessions(start: int, count: int) -> list[httpx.Response]:
            return [
                client.post(
                    url,
                    json={
                        "model": "gpt-4o",
                        "messages": HELLO,
                        "prompt_cache_key": _unique(64 << 10, i),
                    },
                )
                for i in range(start, start + count)
            ]

        # Warm-up: the allocator sizes its arenas for 1 MB bodies once.
        models(0, 20)
        sessions(0, 20)
        assert client.post(url, json={"model": "gpt-4o", "messages": HELLO}).status_code == 200
        before = _rss_kib(pid)
        answers = models(1000, 200) + sessions(1000, 200)
        after = _rss_kib(pid)
        params = {a.json()["error"]["param"] for a in answers if a.status_code == 400}
        assert [a.status_code for a in answers] == [400] * 400
        assert params == {"model", "prompt_cache_key"}
        # The header names a session as well, under the same cap.
        header = {"X-Session-Id": "s" * 2000}
        named = client.post(url, json={"model": "gpt-4o", "messages": HELLO}, headers=header)
        assert named.status_code == 400
        assert named.json()["error"]["param"] == "X-Session-Id"
    grown_mib = (after - before) / 1024
    assert grown_mib < 20, f"RSS grew {grown_mib:.1f} MiB over 400 requests"


@pytest.mark.e2e
def test_a_request_line_copies_a_bounded_amount_of_any_client_value(
    tmp_path: Path, sim_reset: str
) -> None:
    """Even with the caps raised far past them (and the sensitive fields on), no line
    grows with a client's model, session name or path."""
    config = {
        "upstream": {"base_url": f"{sim_reset}/v1"},
        "server": {"max_model_bytes": 4 << 20, "max_body_bytes": 3 << 20},
        "session": {"max_name_bytes": 4 << 20},
        "logging": {"format": "json", "include_sensitive": True},
    }
    huge = "m" * (1 << 20)
    with serve_process(tmp_path, config) as served, httpx.Client(base_url=served.url) as client:
        chat = client.post("/v1/chat/completions", json={"model": huge, "messages": HELLO})
        assert chat.status_code == 200
        named = client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o", "messages": HELLO},
            headers={"X-Session-Id": "s" * 60_000},
        )
        assert named.status_code == 200
        deep = client.get("/v1/files/" + "f" * 60_000)  # the upstream's 404, relayed
        assert deep.status_code == 404
        too_big = client.post(
            "/v1/chat/completions",
            content=orjson.dumps({"model": huge, "messages": HELLO}) + b" " * (3 << 20),
        )
        assert too_big.status_code == 413
        deadline = time.monotonic() + 60
        while served.log().count('"msg":"request"') < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = served.log().splitlines()
    requests = [orjson.loads(line) for line in lines if '"msg":"request"' in line]
    assert len(requests) == 4
    assert {r["status"] for r in requests} == {200, 404, 413}
    longest = max(len(line) for line in lines)
    assert longest < 4 * LOGGED_VALUE_CHARS, f"a log line of {longest} bytes"


def _as_asked_upstream() -> Starlette:
    """Answers every request with the status it asks for (``x-answer-status``); chat
    calls asking for ``x-answer-overflow`` get OpenAI's context-length error."""

    async def answer(request: Request) -> Response:
        await request.body()
        if request.headers.get("x-answer-overflow"):
            error = {
                "message": "This model's maximum context length is 4000 tokens. However, "
                "your messages resulted in 9000 tokens. Please reduce the length.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            return JSONResponse({"error": error}, status_code=400)
        status = int(request.headers.get("x-answer-status", "200"))
        if status == 200 and request.url.path.endswith("/chat/completions"):
            return Response(completion(), media_type="application/json")
        error = {"message": "as asked", "type": "test", "param": None, "code": None}
        return JSONResponse({"error": error}, status_code=status)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", answer, methods=methods)])


@pytest.fixture
def as_asked() -> Iterator[str]:
    with run_server(_as_asked_upstream()) as url:
        yield url


def _series(url: str) -> list[str]:
    text = httpx.get(f"{url}/metrics").text
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# Statuses an upstream may answer with a body (1xx, 204, 205 and 304 carry none).
_STATUSES = [s for s in range(200, 600) if s not in (204, 205, 304)]


def _word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))


@pytest.mark.e2e
def test_metrics_stay_a_few_hundred_series_whatever_clients_and_upstreams_send(
    as_asked: str, start_proxy: Callable[..., str]
) -> None:
    """1,000 requests: random model names (some taught a shared window by two tenants),
    random passthrough paths and unknown URLs, random upstream statuses."""
    url = start_proxy(proxy_settings(as_asked))
    fresh = len(_series(url))  # the fixed label sets every proxy exports (233, 2026-12-02)
    rng = random.Random(20)
    tenants = [{"Authorization": f"Bearer sk-{i}"} for i in range(2)]
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(1000):
            status = {"x-answer-status": str(rng.choice(_STATUSES))}
            kind = i % 5
            if kind == 0:  # the same new model overflows for two tenants: a shared window
                body = {"model": _word(rng), "messages": HELLO}
                for tenant in tenants:
                    overflow = {**tenant, "x-answer-overflow": "1"}
                    client.post("/v1/chat/completions", json=body, headers=overflow)
            elif kind == 1:
                body = {"model": _word(rng), "messages": HELLO}
                client.post("/v1/chat/completions", json=body, headers=status)
            elif kind == 2:
                body = {"model": _word(rng), "input": "hi"}
                client.post("/v1/responses", json=body, headers=status)
            elif kind == 3:
                method = rng.choice(["GET", "POST", "DELETE"])
                client.request(method, f"/v1/{_word(rng)}/{_word(rng)}", headers=status)
            else:
                client.get(f"/{_word(rng)}")  # no route: a 404 of the proxy's own
    assert time.monotonic() - started < 60
    series = _series(url)
    learned = [s for s in series if s.startswith("compaction_proxy_learned_window_tokens")]
    assert learned == ['compaction_proxy_learned_window_tokens{model="other"} 16384.0']
    # What 1,000 hostile requests add is bounded by the label sets, not by the ~600 names
    # and paths they made up (a label taking one: 200+ more). ~220 here (2026-11-26).
    assert len(series) - fresh < 250, f"{fresh} series fresh, {len(series)} after"
    # 2026-12-02: 233 fresh (the model registry's, output ceilings', cache outcomes',
    # regret's and the turn deadline's closed sets added 43), 451 after.
    assert len(series) < 500, f"{fresh} series fresh, {len(series)} series"


def _names(series: list[str]) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in series}


@pytest.mark.e2e
def test_a_fresh_proxy_exports_no_created_series(start_proxy: Callable[..., str]) -> None:
    url = start_proxy(proxy_settings("http://127.0.0.1:9"))
    series = _series(url)
    assert not [name for name in _names(series) if name.endswith("_created")]
    assert len(series) < 250
