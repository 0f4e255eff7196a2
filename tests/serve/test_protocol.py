"""The proxy's HTTP protocol (proxy.serve.limits, proxy.shortcuts.uvicorn_cycle) against
uvicorn's own, in-process on a fake transport: a response of known length goes out in one
write, every response's bytes as uvicorn writes them; an idle connection closes after the
keep-alive timeout without a timer armed per response.

Over sockets, through the whole proxy: tests/e2e (every response goes through it), and
the limits against slow clients: tests/e2e/test_client_limits.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.config import ServerSettings
from proxy.serve.limits import limited_protocol
from proxy.shortcuts.uvicorn_cycle import _BAD_NAME, _BAD_VALUE

App = Callable[[Any, Any, Any], Awaitable[None]]


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.writes.append(b"".join(chunks))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _connect(protocol: type[Any], app: App, request: bytes) -> tuple[Any, _Transport]:
    """A connection to ``protocol`` serving ``app``, ``request`` received and answered."""
    config = Config(app, access_log=False, ws="none", lifespan="off", log_config=None)
    state = ServerState()
    server = protocol(config=config, server_state=state, app_state={})
    transport = _Transport()
    server.connection_made(transport)
    server.data_received(request)
    for _ in range(50):  # the app's task and what it awaits
        await asyncio.sleep(0)
    for task in state.tasks:
        task.cancel()
    return server, transport


async def _serve(protocol: type[Any], app: App, request: bytes) -> _Transport:
    return (await _connect(protocol, app, request))[1]


def _answer(*headers: tuple[bytes, bytes], body: bytes = b"hello", length: int = 5) -> App:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        given = [(b"content-type", b"text/plain"), *headers]
        if length >= 0:
            given.append((b"content-length", str(length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": given})
        await send({"type": "http.response.body", "body": body})

    return app


GET = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
HEAD = b"HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n"
CASES = {
    "known length": (_answer((b"X-Compaction-Status", b"passthrough")), GET),
    "known length, large": (_answer(body=b"x" * 100_000, length=100_000), GET),
    "head request": (_answer(body=b""), HEAD),
    "chunked": (_answer(body=b"hello", length=-1), GET),
    "connection close": (_answer((b"connection", b"close")), GET),
    "bad header name": (_answer((b"bad name", b"v")), GET),
    "bad header value": (_answer((b"x-v", b"a\nb")), GET),
    "longer than its length": (_answer(body=b"hello!", length=5), GET),
    "shorter than its length": (_answer(body=b"hell", length=5), GET),
    # Cycle._render_head's common answer (lower-case names, one length) and its edges.
    "lower-case names": (_answer((b"x-compaction-status", b"passthrough")), GET),
    "http/1.0": (_answer((b"x-a", b"b")), GET.replace(b"HTTP/1.1", b"HTTP/1.0")),
    "two lengths": (_answer((b"content-length", b"5")), GET),
    "length and chunked": (_answer((b"transfer-encoding", b"chunked")), GET),
    "keep-alive named": (_answer((b"connection", b"keep-alive")), GET),
    "upper-case length": (_answer((b"Content-Length", b"5"), length=-1), GET),
    "no content": (_answer(body=b"", length=0), GET),
    "bad value byte": (_answer((b"x-v", b"a\x7fb")), GET),
    "tab in a value": (_answer((b"x-v", b"a\tb")), GET),
}


@pytest.mark.parametrize("case", CASES)
async def test_each_response_is_written_as_uvicorn_writes_it(case: str) -> None:
    app, request = CASES[case]
    theirs = await _serve(HttpToolsProtocol, app, request)
    ours = await _serve(limited_protocol(ServerSettings()), app, request)
    assert b"".join(ours.writes) == b"".join(theirs.writes)
    assert ours.closed == theirs.closed


def test_the_bytes_a_header_may_not_hold_are_uvicorns() -> None:
    """Cycle checks a response's headers by deleting these bytes, not by uvicorn's searches."""
    for byte in (bytes([b]) for b in range(256)):
        assert bool(HEADER_RE.search(byte)) == (byte in _BAD_NAME)
        assert bool(HEADER_VALUE_RE.search(byte)) == (byte in _BAD_VALUE)


@pytest.mark.usefixtures("shortcuts_on")  # the shortcut's own way
@pytest.mark.parametrize("case", ["known length", "known length, large", "head request"])
async def test_a_response_of_known_length_goes_out_in_one_write(case: str) -> None:
    app, request = CASES[case]
    ours = await _serve(limited_protocol(ServerSettings()), app, request)
    assert len(ours.writes) == 1
    assert ours.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_streams_head_goes_out_before_its_first_event() -> None:
    """A stream's first event may take a while: its head does not wait for it."""
    first_event = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await first_event.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n"})

    ours = await _serve(limited_protocol(ServerSettings()), stream, GET)
    assert len(ours.writes) == 1
    assert b"transfer-encoding: chunked" in ours.writes[0]
    assert ours.writes[0].endswith(b"\r\n\r\n")


async def test_an_idle_connection_closes_after_the_keepalive_timeout() -> None:
    """uvicorn arms a timer per response for it (and cancels it as the next request
    comes): the watchdog's tick closes the connection instead, up to a tick late."""
    settings = ServerSettings(keepalive_timeout_s=1)  # a tick: 0.25 s
    server, transport = await _connect(limited_protocol(settings), _answer(), GET)
    assert transport.writes
    assert server.timeout_keep_alive_task is None  # no timer of its own
    await asyncio.sleep(0.8)
    assert not transport.closed
    server.data_received(GET)  # a second request: idle again from its answer
    for _ in range(50):
        await asyncio.sleep(0)
    assert b"".join(transport.writes).count(b"HTTP/1.1 200 OK") == 2
    await asyncio.sleep(0.8)
    assert not transport.closed
    await asyncio.sleep(0.6)
    assert transport.closed


async def test_a_connection_answered_before_its_body_ended_still_closes_when_idle() -> None:
    """An answer before the request's body has all arrived (a 404, an upstream's early
    error): the body's rest arrives after it, then nothing. uvicorn's timer, armed at the
    answer and cancelled by that rest, never closed it (nor did the tick): a client could
    hold a connection for ever with one request and silence."""

    async def early(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    settings = ServerSettings(keepalive_timeout_s=1)  # a tick: 0.25 s
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
    server, transport = await _connect(limited_protocol(settings), early, head)
    assert transport.writes[0].startswith(b"HTTP/1.1 404 Not Found\r\n")
    server.data_received(b"hello")  # the body's rest: the request is over
    await asyncio.sleep(0.8)
    assert not transport.closed
    await asyncio.sleep(0.6)
    assert transport.closed


async def test_a_request_behind_an_early_answers_body_is_not_closed_as_idle() -> None:
    """The body's rest and the next request in one read: that request, running, is not
    an idle connection, however long its answer takes."""
    running = asyncio.Event()

    async def early_then_slow(scope: Any, receive: Any, send: Any) -> None:
        if scope["method"] == "GET":
            running.set()
            await asyncio.sleep(10)  # a long answer (cancelled at the end)
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    settings = ServerSettings(keepalive_timeout_s=1)  # a tick: 0.25 s
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
    server, transport = await _connect(limited_protocol(settings), early_then_slow, head)
    server.data_received(b"hello" + GET)
    await asyncio.sleep(1.6)
    assert running.is_set()
    assert not transport.closed
    for task in server.tasks:
        task.cancel()
