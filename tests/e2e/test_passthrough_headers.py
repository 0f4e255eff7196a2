"""What the upstream receives besides the path: headers, bodies, and how long it may take."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.logs import all_logs, assert_one_break_warning
from tests.support.servers import proxy_settings, run_server
from tests.support.timing import slack_s

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class _Upstream:
    """Records the method, headers (lower-cased names) and body of every request; the
    proxy's own questions about its models (upstream/discovery.py) apart."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.asked: list[str] = []

    async def record(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("x-compaction-purpose") == "discover":
            self.asked.append(request.url.path)
        else:
            self.seen.append((request.method, dict(request.headers), body))
        return JSONResponse({"object": "list", "data": []})


@pytest.fixture
def recorded(start_proxy: Callable[..., str]) -> Iterator[tuple[str, _Upstream]]:
    upstream = _Upstream()
    app = Starlette(routes=[Route("/{path:path}", upstream.record, methods=_METHODS)])
    with run_server(app) as url:
        yield start_proxy(proxy_settings(url)), upstream


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
)
def test_headers_named_in_connection_are_not_forwarded(
    recorded: tuple[str, _Upstream], method: str, path: str
) -> None:
    proxy, upstream = recorded
    headers = {"Connection": "keep-alive, X-Secret,x-other", "X-Secret": "s", "X-Other": "o"}
    r = httpx.request(
        method,
        f"{proxy}{path}",
        headers={**headers, "X-Kept": "k"},
        json=CHAT if method == "POST" else None,
    )
    assert r.status_code == 200
    ((_, seen, _),) = upstream.seen
    assert seen["x-kept"] == "k"
    assert "x-secret" not in seen
    assert "x-other" not in seen


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
)
def test_clients_compaction_headers_are_not_forwarded(
    recorded: tuple[str, _Upstream], method: str, path: str
) -> None:
    """x-compaction-purpose marks the proxy's own summarizer calls; a client cannot fake one."""
    proxy, upstream = recorded
    headers = {
        "X-Compaction-Purpose": "summarize",
        "X-Compaction-Anything": "1",
        "X-Compaction": "off",
        "X-Kept": "k",
    }
    r = httpx.request(
        method, f"{proxy}{path}", headers=headers, json=CHAT if method == "POST" else None
    )
    assert r.status_code == 200
    ((_, seen, _),) = upstream.seen
    assert seen["x-kept"] == "k"
    assert not [name for name in seen if name.startswith("x-compaction")]


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
)
def test_a_relayed_response_has_one_date_and_one_server_header(
    recorded: tuple[str, _Upstream], method: str, path: str
) -> None:
    """The upstream (uvicorn here, as the proxy) sends its own Date and Server."""
    proxy, _ = recorded
    r = httpx.request(method, f"{proxy}{path}", json=CHAT if method == "POST" else None)
    assert r.status_code == 200
    assert len(r.headers.get_list("date")) == 1
    assert len(r.headers.get_list("server")) == 1


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "OPTIONS"])
def test_bodiless_requests_go_upstream_without_a_body(
    recorded: tuple[str, _Upstream], method: str
) -> None:
    proxy, upstream = recorded
    r = httpx.request(method, f"{proxy}/v1/files/file-abc")
    assert r.status_code == 200
    ((seen_method, seen, body),) = upstream.seen
    assert seen_method == method
    assert "transfer-encoding" not in seen
    assert seen.get("content-length", "0") == "0"
    assert body == b""


def test_bodies_still_go_upstream_with_their_length(recorded: tuple[str, _Upstream]) -> None:
    proxy, upstream = recorded
    r = httpx.request("DELETE", f"{proxy}/v1/files/file-abc", content=b'{"x": 1}')
    assert r.status_code == 200
    ((_, seen, body),) = upstream.seen
    assert body == b'{"x": 1}'
    assert seen["content-length"] == "8"


# upstream.total_timeout_s: one upstream call, streams included, has a deadline.

_DRIP_S = 0.2
_DRIP_CHUNKS = 40  # 8 s: bounded, so a proxy without the deadline still lets the test end


@pytest.fixture
def dripping(start_proxy: Callable[..., str]) -> Iterator[tuple[str, threading.Event]]:
    """A proxy with a 1 s total timeout in front of an upstream that streams one SSE
    chunk every 0.2 s, or sleeps before answering at all on /v1/slow."""
    stopped = threading.Event()

    async def drip() -> AsyncIterator[bytes]:
        try:
            for i in range(_DRIP_CHUNKS):
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(_DRIP_S)
        finally:
            stopped.set()

    async def events(request: Request) -> Response:
        return StreamingResponse(drip(), media_type="text/event-stream")

    async def slow(request: Request) -> Response:
        await asyncio.sleep(_DRIP_S * _DRIP_CHUNKS)
        return JSONResponse({})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", events, methods=["POST"]),
            Route("/v1/events", events),
            Route("/v1/slow", slow),
        ]
    )
    with run_server(app) as url:
        yield start_proxy(proxy_settings(url, upstream={"total_timeout_s": 1})), stopped


def _past_the_deadline(proxy: str) -> float:
    """How long after the start the 1 s total timeout must have ended an exchange: slack
    for a busy machine (tests.support.timing), below the 8 s the upstream takes without it."""
    return min(1 + slack_s(proxy, 2.0), _DRIP_S * _DRIP_CHUNKS - 2)


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/events"), ("POST", "/v1/chat/completions")]
)
def test_a_dripping_stream_ends_at_the_total_timeout(
    dripping: tuple[str, threading.Event],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
) -> None:
    proxy, stopped = dripping
    bound = _past_the_deadline(proxy)
    chunks = []
    start = time.monotonic()
    with (
        all_logs(caplog),
        httpx.stream(method, f"{proxy}{path}", json={**CHAT, "stream": True}, timeout=30) as r,
    ):
        assert r.status_code == 200
        chunks = list(r.iter_raw())
    elapsed = time.monotonic() - start
    assert 0.8 < elapsed < bound, (elapsed, bound)
    assert 0 < len(chunks) < _DRIP_CHUNKS
    # The proxy closed its upstream connection: the upstream stopped generating.
    assert stopped.wait(timeout=3)
    # One warning line, no ASGI traceback: the client's stream ended cleanly.
    assert_one_break_warning(caplog, "TimeoutError")


def test_no_headers_within_the_total_timeout_is_a_504(
    dripping: tuple[str, threading.Event],
) -> None:
    proxy, _ = dripping
    bound = _past_the_deadline(proxy)
    start = time.monotonic()
    r = httpx.get(f"{proxy}/v1/slow", timeout=30)
    assert time.monotonic() - start < bound
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
