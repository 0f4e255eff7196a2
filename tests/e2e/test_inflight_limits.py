"""Issue 20 item 4: request bodies held at once and open client connections are bounded
per worker process (server.max_inflight_body_bytes, server.max_client_connections).

Real sockets on 127.0.0.1 against the proxy served as production serves it. The budget's
count is read from the serving app's own services (same process) to wait on it exactly.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import proxy_settings, run_proxy, run_server

MIB = 1024 * 1024
LIMITS = {"max_body_bytes": MIB, "max_inflight_body_bytes": 5 * MIB // 2}
CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
CHAT_PATH, PASS_PATH = "/v1/chat/completions", "/v1/embeddings"


def _padded(size: int) -> bytes:
    """A valid chat body of exactly ``size`` bytes (JSON allows trailing whitespace)."""
    return CHAT + b" " * (size - len(CHAT))


async def _upstream(request: Request) -> Response:
    await request.body()
    if request.url.path.endswith("/slow"):

        async def drip() -> AsyncIterator[bytes]:
            for _ in range(100):
                yield b"x" * 1024
                await asyncio.sleep(0.05)

        return StreamingResponse(drip(), media_type="application/octet-stream")
    return JSONResponse({"object": "list", "data": []})


class _Capture:
    """The proxy's app, keeping a handle on its services (for the budget's count)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.services: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.services = scope["state"]["services"]
        await self.app(scope, receive, send)


class _Proxy:
    def __init__(self, url: str, capture: _Capture) -> None:
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.capture = capture
        assert httpx.get(f"{url}/healthz").status_code == 200

    @property
    def used(self) -> int:
        return int(self.capture.services.bodies.used)

    def wait_used(self, expected: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.used != expected:
            assert time.monotonic() < deadline, f"budget holds {self.used}, not {expected}"
            time.sleep(0.01)

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=10)

    def hold(self, path: str, size: int) -> socket.socket:
        """A request declaring ``size`` body bytes that sends only the first KiB of them."""
        sock = self.connect()
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {size}\r\n\r\n".encode() + _padded(size)[:1024])
        return sock

    def post(self, path: str, body: bytes) -> httpx.Response:
        headers = {"content-type": "application/json"}
        return httpx.post(f"{self.url}{path}", content=body, headers=headers, timeout=30)


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    from proxy.app import create_app

    routes = [Route("/{path:path}", _upstream, methods=["GET", "POST"])]
    with run_server(Starlette(routes=routes)) as upstream:
        settings = proxy_settings(upstream, server=LIMITS)
        capture = _Capture(create_app(settings))
        with run_proxy(settings, capture) as url:
            yield _Proxy(url, capture)


def _read_answer(sock: socket.socket, timeout_s: float = 5.0) -> bytes:
    """What the proxy sends until it closes the connection (or ``timeout_s``)."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a kept-alive connection."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head + b"\r\n\r\n" + body


def _assert_overloaded(status: int, headers: Any, body: bytes) -> None:
    assert status == 503, body[:300]
    assert headers["retry-after"] == "1"
    error = orjson.loads(body)["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "server_overloaded"
    assert error["message"]


def test_bodies_beyond_the_budget_get_503_while_small_ones_pass(proxy: _Proxy) -> None:
    holds = [proxy.hold(CHAT_PATH, MIB), proxy.hold(PASS_PATH, MIB)]
    proxy.wait_used(2 * MIB)
    # Another whole body would take 3 MiB of 2.5: refused on every route, unread.
    for path in (CHAT_PATH, "/v1/responses", PASS_PATH):
        r = proxy.post(path, _padded(MIB))
        _assert_overloaded(r.status_code, r.headers, r.content)
    with proxy.connect() as sock:
        head = f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {MIB}\r\n\r\n"
        sock.sendall(head.encode())  # not a byte of the body: the answer comes anyway
        sock.settimeout(5)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"\r\nretry-after: 1\r\n" in answer.lower()
    # Half a MiB fits exactly (2 + 0.5 = the budget), on both routes.
    for path in (CHAT_PATH, PASS_PATH):
        r = proxy.post(path, _padded(MIB // 2))
        assert r.status_code == 200, r.text
    proxy.wait_used(2 * MIB)
    for sock in holds:
        sock.close()  # gone mid-body
    proxy.wait_used(0)
    # Freed: a whole body passes again.
    assert proxy.post(CHAT_PATH, _padded(MIB)).status_code == 200
    proxy.wait_used(0)


def test_a_chunked_body_is_counted_as_it_arrives(proxy: _Proxy) -> None:
    holds = [proxy.hold(CHAT_PATH, MIB), proxy.hold(CHAT_PATH, MIB)]
    proxy.wait_used(2 * MIB)

    def chunked(size: int) -> bytes:
        with proxy.connect() as sock:
            # Kept alive: the proxy reads (and drops) the rest after a 503 rather than
            # closing on a client still sending, which could reset the answer away.
            head = f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            sock.sendall(head.encode())
            body, step = _padded(size), 64 * 1024
            for i in range(0, size, step):
                piece = body[i : i + step]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sock.sendall(b"0\r\n\r\n")
            return _read_response(sock)

    answer = chunked(3 * MIB // 4)  # 2.75 MiB of 2.5: refused once its chunks pass 0.5
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert b"\r\nretry-after: 1\r\n" in answer.lower()
    proxy.wait_used(2 * MIB)
    assert chunked(MIB // 4).startswith(b"HTTP/1.1 200 ")
    proxy.wait_used(2 * MIB)
    for sock in holds:
        sock.close()
    proxy.wait_used(0)


def test_the_budget_returns_to_zero_after_errors_and_disconnects(proxy: _Proxy) -> None:
    r = proxy.post(CHAT_PATH, b"{" + b" " * (MIB - 1))  # invalid JSON
    assert r.status_code == 400
    proxy.wait_used(0)
    r = proxy.post(CHAT_PATH, _padded(MIB + 1))  # over max_body_bytes: 413, unread
    assert r.status_code == 413
    proxy.wait_used(0)
    for path in (CHAT_PATH, PASS_PATH):  # gone mid-body
        sock = proxy.hold(path, MIB)
        proxy.wait_used(MIB)
        sock.close()
        proxy.wait_used(0)
    # Gone while the answer streams (the body held until then).
    sock = proxy.hold("/v1/slow", MIB // 2)
    sock.sendall(_padded(MIB // 2)[1024:])
    sock.settimeout(5)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert proxy.used == MIB // 2
    sock.close()
    proxy.wait_used(0)
    # Every allowed size, one after another: nothing left behind.
    for size in (100, MIB // 3, MIB):
        assert proxy.post(CHAT_PATH, _padded(size)).status_code == 200
        assert proxy.post(PASS_PATH, _padded(size)).status_code == 200
    proxy.wait_used(0)


CAP = 4


@pytest.fixture
def capped(sim_reset: str, start_proxy: Callable[..., str]) -> tuple[str, int]:
    url = start_proxy(proxy_settings(sim_reset, server={"max_client_connections": CAP}))
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _healthz(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    answer = b""
    while b'{"status":"ok"}' not in answer:
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    return answer


def test_connections_beyond_the_cap_are_refused_while_open_ones_are_served(
    capped: tuple[str, int],
) -> None:
    open_ = [socket.create_connection(capped, timeout=10) for _ in range(CAP)]
    try:
        for sock in open_:
            assert _healthz(sock).startswith(b"HTTP/1.1 200 ")  # kept alive
        for _ in range(3):
            with socket.create_connection(capped, timeout=10) as extra:
                answer = _read_answer(extra)  # refused before it sends anything
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
            head, _, body = answer.partition(b"\r\n\r\n")
            assert b"\r\nretry-after: 1\r\n" in head.lower()
            assert orjson.loads(body)["error"]["code"] == "server_overloaded"
        for sock in open_:  # the open ones are served as before
            assert _healthz(sock).startswith(b"HTTP/1.1 200 ")
        open_.pop().close()
        deadline = time.monotonic() + 60
        while True:  # its place is free once the proxy has seen it close
            with socket.create_connection(capped, timeout=10) as again:
                try:
                    if _healthz(again).startswith(b"HTTP/1.1 200 "):
                        break
                except (AssertionError, ConnectionResetError):
                    pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        for sock in open_:
            sock.close()
