"""Issue 8: slow and hostile clients are bounded; SIGTERM has a deadline.

Real sockets on 127.0.0.1 against the proxy served as production serves it
(proxy.serve.server's protocol, via the conftest fixtures).
"""

from __future__ import annotations

import asyncio
import logging
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import proxy_settings, run_server
from tests.support.timing import slack_s

LIMITS = {
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.0,
    "max_header_bytes": 8192,
    "min_body_rate_bytes_s": 20,  # test_a_slow_but_moving_body_is_not_cut sends 40 B/s
}
# The watchdog ticks every quarter of the smallest timeout; the rest is scheduling slack,
# more on a busy machine (tests.support.timing). Without the limits a connection would
# live until the keep-alive timeout (75 s), far past any such slack.
MARGIN_S = 1.5


def _margin(address: tuple[str, int]) -> float:
    host, port = address
    return slack_s(f"http://{host}:{port}", MARGIN_S)


@pytest.fixture
def limited_proxy(sim_reset: str, start_proxy: Callable[..., str]) -> tuple[str, int]:
    url = start_proxy(proxy_settings(sim_reset, server=LIMITS))
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=10)


def _closed_within(sock: socket.socket, limit_s: float) -> tuple[bool, float, bytes]:
    """Read until the peer closes or ``limit_s`` passes: (closed, seconds, bytes read)."""
    start = time.monotonic()
    data = b""
    while (left := limit_s - (time.monotonic() - start)) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return True, time.monotonic() - start, data
        if not chunk:
            return True, time.monotonic() - start, data
        data += chunk
    return False, time.monotonic() - start, data


def test_a_1mb_header_gets_431_before_it_is_all_read(limited_proxy: tuple[str, int]) -> None:
    sock = _connect(limited_proxy)
    sent = 0
    answer = b""
    with sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
            while sent < 1024 * 1024:
                sock.sendall(b"a" * 16384)
                sent += 16384
                if select.select([sock], [], [], 0.01)[0]:
                    break
        except OSError:
            pass  # the proxy hung up mid-header: also a refusal
        _, _, answer = _closed_within(sock, 5)
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]
    if answer:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b'"code":"request_header_fields_too_large"' in answer
    # The proxy answered once the limit was crossed, not after buffering a megabyte.
    assert sent < 256 * 1024, sent


def test_many_small_headers_over_the_limit_get_431(limited_proxy: tuple[str, int]) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(300))
    with _connect(limited_proxy) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        closed, _, answer = _closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert closed


def test_headers_under_the_limit_are_served(limited_proxy: tuple[str, int]) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(100))
    with _connect(limited_proxy) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        _, _, answer = _closed_within(sock, 2)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_a_trickled_request_head_is_cut_at_header_timeout(limited_proxy: tuple[str, int]) -> None:
    margin = _margin(limited_proxy)
    with _connect(limited_proxy) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        closed = False
        # A byte every 0.2 s: always some progress, never a complete head.
        while not closed and time.monotonic() - start < 1.0 + margin + 2:
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            closed, _, _ = _closed_within(sock, 0.2)
        elapsed = time.monotonic() - start
    assert closed, "the half-sent request head was never cut"
    assert elapsed < 1.0 + margin, (elapsed, margin)


def test_a_silent_connection_is_cut_at_header_timeout(limited_proxy: tuple[str, int]) -> None:
    margin = _margin(limited_proxy)
    with _connect(limited_proxy) as sock:
        closed, elapsed, _ = _closed_within(sock, 1.0 + margin + 2)
    assert closed
    assert elapsed < 1.0 + margin, (elapsed, margin)


@pytest.mark.parametrize(
    ("path", "length"),
    [
        (b"/v1/chat/completions", b"Content-Length: 1000"),
        (b"/v1/files", b"Content-Length: 1000"),  # passthrough, read whole
        (b"/v1/files", b"Transfer-Encoding: chunked"),  # passthrough, streamed upstream
    ],
)
def test_a_stalled_body_is_cut_at_body_timeout(
    limited_proxy: tuple[str, int], caplog: pytest.LogCaptureFixture, path: bytes, length: bytes
) -> None:
    head = (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\n" + length + b"\r\n\r\n"
    )
    if length.startswith(b"Transfer"):
        head += b"17\r\n"  # a first chunk's size line: 23 bytes follow
    margin = _margin(limited_proxy)
    with caplog.at_level(logging.ERROR), _connect(limited_proxy) as sock:
        sock.sendall(head + b'{"model": "sim-model", ')
        closed, elapsed, answer = _closed_within(sock, 1.0 + margin + 2)
    assert closed, answer
    assert elapsed < 1.0 + margin, (elapsed, margin)
    time.sleep(0.3)  # let the app notice the disconnect
    # The app's body read ended as a disconnect, not as an unhandled exception.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_trickled_body_is_cut_at_the_minimum_rate(
    limited_proxy: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    """A byte every 0.5 s never stalls for body_timeout_s, yet would never end."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    margin = _margin(limited_proxy)
    started = time.monotonic()
    closed = False
    with caplog.at_level(logging.ERROR), _connect(limited_proxy) as sock:
        sock.sendall(head)
        for _ in range(int(2 * (1.0 + 2 * margin)) + 4):  # a byte each 0.5 s, past the bound
            try:
                sock.sendall(b" ")
            except OSError:
                closed = True
                break
            done, _, _ = _closed_within(sock, 0.5)
            if done:
                closed = True
                break
    elapsed = time.monotonic() - started
    assert closed
    assert elapsed < 1.0 + 2 * margin, (elapsed, margin)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_slow_but_moving_body_is_not_cut(limited_proxy: tuple[str, int]) -> None:
    body = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with _connect(limited_proxy) as sock:
        sock.sendall(head)
        pieces = [body[i : i + 10] for i in range(0, len(body), 10)]
        # Longer than body_timeout_s in total, never that long between reads.
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.25)
        _, _, answer = _closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]


def test_keep_alive_connection_serves_requests_in_turn(limited_proxy: tuple[str, int]) -> None:
    host, port = limited_proxy
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=10) as client:
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
            time.sleep(0.5)  # idle between requests is keep-alive's, not a head timeout


# --- shutdown -------------------------------------------------------------------------


def _stalling_upstream(release: threading.Event) -> Any:
    """Answers any chat request with one SSE event, then stalls until released (bounded)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        event = (
            b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
        )
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await asyncio.to_thread(release.wait, 60)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


@pytest.fixture
def stalling_upstream() -> Iterator[str]:
    release = threading.Event()
    with run_server(_stalling_upstream(release)) as url:
        try:
            yield url
        finally:
            release.set()


def test_sigterm_ends_a_stalled_stream_within_shutdown_timeout(
    stalling_upstream: str,
    spawn_proxy_process: Callable[[dict[str, Any]], tuple[str, Any]],
) -> None:
    config = {
        "upstream": {"base_url": f"{stalling_upstream}/v1"},
        "server": {"shutdown_timeout_s": 2},
    }
    url, process = spawn_proxy_process(config)
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=chat) as response,
    ):
        assert response.status_code == 200
        # Keep the iterator: dropping it would close the stream from our side.
        chunks = response.iter_raw()
        assert b"data:" in next(chunks)
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        # The stalled stream would hold a proxy that does not end it for 60 s; a busy
        # machine (the process's exit writes its coverage data) takes seconds, not that.
        try:
            process.wait(timeout=2 + 20)
        except Exception:
            pytest.fail("the proxy was still waiting on the stalled stream after SIGTERM")
        elapsed = time.monotonic() - start
    assert elapsed < 2 + 20, elapsed
    assert elapsed > 1.5, "in-flight requests get their grace period first"
