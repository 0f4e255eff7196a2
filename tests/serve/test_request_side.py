"""The request side of the proxy's HTTP protocol (proxy.shortcuts.uvicorn_cycle ``RequestSide`` and
``Cycle.receive``) against uvicorn's own, in-process on a fake transport: the same scope,
the same ``receive`` messages however the bytes arrive, the same writes and flow control;
a body that arrives in one read reaches the app as the parser's bytes, never copied.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.config import ServerSettings
from proxy.serve.limits import limited_protocol


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[Any] = []  # writes, pauses and resumes, in order
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data: Any) -> None:
        self.events.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.events.append(b"".join(chunks))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.events.append("pause")

    def resume_reading(self) -> None:
        self.events.append("resume")


def _recording(seen: list[Any]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(dict(scope))
        while True:
            message = await receive()
            seen.append((message, type(message.get("body"))))
            if not message.get("more_body"):
                break
        body = b"ok %d" % len(seen)
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def _run(
    protocol: type[Any], pieces: list[bytes], turns: int, **options: Any
) -> tuple[Any, ...]:
    """``pieces`` received in turn, ``turns`` loop turns after each; what the app saw,
    what the transport was asked, and the server."""
    seen: list[Any] = []
    app, off = _recording(seen), "off"
    config = Config(app, access_log=False, ws="none", lifespan=off, log_config=None, **options)
    config.proxy_headers = False
    state = ServerState()
    server = protocol(config=config, server_state=state, app_state={"k": "v"})
    transport = _Transport()
    server.connection_made(transport)
    for piece in pieces:
        server.data_received(piece)
        for _ in range(turns):
            await asyncio.sleep(0)
    for _ in range(50):
        await asyncio.sleep(0)
    for task in state.tasks:
        task.cancel()
    return seen, _joined(transport.events), transport.closed, server


def _joined(events: list[Any]) -> list[Any]:
    """Writes back to back as one (a response's head goes with its body: test_protocol.py)."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, bytes) and out and isinstance(out[-1], bytes):
            out[-1] += event
        else:
            out.append(event)
    return out


def _post(body: bytes, path: bytes = b"/v1/chat/completions", extra: bytes = b"") -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n%s\r\n" % (
        path,
        len(body),
        extra,
    )
    return head + body


BODY = b'{"model": "m", "messages": []}' * 300  # ~9 KB
BIG = b"x" * 150_000  # past uvicorn's HIGH_WATER_LIMIT (64 KB): reading pauses
ONE = _post(BODY)
CHUNKED = (
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
)
CASES = {
    "one read": ([ONE], 1),
    "head and body apart": ([ONE[:60], ONE[60:]], 1),
    "body in pieces, read between": ([ONE[:60], ONE[60:3000], ONE[3000:6000], ONE[6000:]], 3),
    "body in pieces, none read between": ([ONE[:60], ONE[60:3000], ONE[3000:]], 0),
    "large, in pieces": ([_post(BIG)[:70_000], _post(BIG)[70_000:]], 0),
    "large, in pieces, read between": ([_post(BIG)[:70_000], _post(BIG)[70_000:]], 2),
    "query and escapes": ([_post(b"{}", b"/v1/a%20b?x=1&y=%20")], 1),
    "http 1.0": ([_post(b"{}").replace(b"HTTP/1.1", b"HTTP/1.0")], 1),
    "expect 100-continue": ([_post(b"{}", extra=b"Expect: 100-continue\r\n")], 1),
    "connection close": ([_post(b"{}", extra=b"Connection: close\r\n")], 1),
    "empty body": ([_post(b"")], 1),
    "chunked": ([CHUNKED], 1),
    "chunked, in pieces": ([CHUNKED[:70], CHUNKED[70:80], CHUNKED[80:]], 1),
    "pipelined": ([ONE + _post(b"{}", b"/second")], 1),
}


@pytest.mark.parametrize("case", CASES)
async def test_the_app_sees_what_uvicorn_gives_it(case: str) -> None:
    pieces, turns = CASES[case]
    theirs = await _run(HttpToolsProtocol, pieces, turns)
    ours = await _run(limited_protocol(ServerSettings()), pieces, turns)
    assert ours[:3] == theirs[:3]
    assert ours[0][0]["path"]  # the app ran


async def test_over_uvicorns_concurrency_limit_the_answer_is_uvicorns_503() -> None:
    """Not a setting of the proxy's (it bounds connections itself), but uvicorn's code path."""
    theirs = await _run(HttpToolsProtocol, [ONE], 1, limit_concurrency=1)
    ours = await _run(limited_protocol(ServerSettings()), [ONE], 1, limit_concurrency=1)
    assert ours[:3] == theirs[:3]
    assert ours[1][0].startswith(b"HTTP/1.1 503 Service Unavailable\r\n")


@pytest.mark.usefixtures("shortcuts_on")  # the shortcut's own way
async def test_a_body_in_one_read_is_the_parsers_bytes_not_a_copy() -> None:
    """uvicorn appends a body to a ``bytearray`` and hands the app a ``bytes`` copy of it:
    two copies of every body. A body in one piece is kept as the parser gave it."""
    blocked = asyncio.Event()

    async def waits(scope: Any, receive: Any, send: Any) -> None:
        await blocked.wait()  # the body arrives before the app reads it

    config = Config(waits, access_log=False, ws="none", lifespan="off", log_config=None)
    state = ServerState()
    server = limited_protocol(ServerSettings())(config=config, server_state=state, app_state={})
    server.connection_made(_Transport())
    server.data_received(ONE)
    held = server.cycle.body
    assert type(held) is bytes
    assert held == BODY
    message = await server.cycle.receive()
    assert message["body"] is held  # handed over as it is
    assert server.cycle.body == b""
    for task in state.tasks:
        task.cancel()
