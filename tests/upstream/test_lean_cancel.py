"""Calls cancelled anywhere (connecting, writing a body, waiting for the head, reading the
body) leave nothing behind on either path of ``UpstreamClient._request``: no connection
held, none back in the pool mid-exchange (the next calls' requests arrive well formed), no
deadline, no socket."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from proxy.upstream.client import UpstreamClient
from tests.support.servers import proxy_settings
from tests.support.shortcuts import switch


class _SlowUpstream:
    """Reads each request whole (length or chunked), answers it in three pieces with the
    request's ``x-n`` as its body (an answer read on the wrong call shows)."""

    def __init__(self) -> None:
        self.malformed: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"POST /v1/x HTTP/1.1\r\n"):
                    self.malformed.append(head[:80])
                    return
                if b"chunked" in head.lower():
                    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                        await reader.readexactly(size + 2)
                    await reader.readexactly(2)
                else:
                    length = head.lower().partition(b"content-length:")[2].split(b"\r\n")[0]
                    await reader.readexactly(int(length or 0))
                n = head.partition(b"x-n: ")[2].split(b"\r\n")[0]
                answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(n), n)
                for piece in (answer[:20], answer[20:-1], answer[-1:]):
                    await asyncio.sleep(0.001)
                    writer.write(piece)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _chunks() -> AsyncIterator[bytes]:
    for _ in range(20):
        await asyncio.sleep(0)
        yield b"y" * 1000


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "aiohttp's"])
async def test_cancelled_calls_leave_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    switch(monkeypatch, lean)
    upstream = _SlowUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = UpstreamClient(proxy_settings(url, upstream={"max_connections": 4}))
    before = _fds()

    sent = 0

    async def call(i: int) -> bytes:
        nonlocal sent
        sent += 1
        n = b"%d" % sent
        body = [b"{}", b"x" * (1024 * 1024 + 1), _chunks()][i % 3]
        response = await client.send("POST", f"{url}/v1/x", [(b"x-n", n)], body)
        answer = await response.aread_closed()
        assert answer == n
        return answer

    try:
        for step in range(60):
            calls = [asyncio.create_task(call(i)) for i in range(6)]
            for _ in range(step % 20):  # cancelled at a different point each round
                await asyncio.sleep(0.0005 * (step // 20))
            for task in calls:
                task.cancel()
            for outcome in await asyncio.gather(*calls, return_exceptions=True):
                assert not isinstance(outcome, AssertionError), outcome
        connector = client._session.connector
        assert connector is not None
        assert not connector._acquired
        assert not client._deadlines._due
        for i in range(9):
            await call(i)
        assert upstream.malformed == []
        pooled = sum(len(conns) for conns in connector._conns.values())
        # One pooled connection, and the upstream's end of it (same process).
        assert _fds() - before <= 2 * pooled
    finally:
        await client.aclose()
        server.close()
        for writer in upstream.writers:
            writer.close()
        await server.wait_closed()
