"""A raw asyncio upstream on a real socket that answers with headers and then breaks its
body off, and the chunks it sends."""

from __future__ import annotations

import asyncio
import socket
import struct
from contextlib import suppress
from types import TracebackType

CHUNKS = [b'data: {"n": 0}\n\n', b'data: {"n": 1}\n\n']


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


_WAIT_S = 5.0  # longest anything here waits for the other side


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def _asks_about_models(head: bytes) -> bool:
    """The proxy's own question about its models (upstream/discovery.py's purpose)."""
    return b"\r\nx-compaction-purpose: discover\r\n" in head.lower()


class BreakingUpstream:
    """Answers every request with ``head`` and ``body`` (the proxy's own GETs about its
    models with a 404), then waits until ``cut`` is set (at most ``_WAIT_S``) and resets
    the connection (RST, not a clean close)."""

    def __init__(self, head: bytes, body: bytes) -> None:
        self.head = head
        self.body = body
        self.cut = asyncio.Event()
        self.requests = 0
        self.asked = 0  # GETs (upstream/discovery.py's), answered 404 and not broken
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> BreakingUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        self.cut.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=_WAIT_S)
        await self._server.wait_closed()

    async def _next_head(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next request's head on a connection, or None once it closed, ``cut`` was
        set or ``_WAIT_S`` passed without one."""
        read = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        cut = asyncio.ensure_future(self.cut.wait())
        await asyncio.wait((read, cut), timeout=_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        for pending in (read, cut):
            pending.cancel()
        if not read.done() or read.cancelled() or read.exception() is not None:
            return None
        return read.result()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _WAIT_S)
            while _asks_about_models(head):  # the proxy's own question: no models listed
                self.asked += 1
                writer.write(_NOT_FOUND)
                await writer.drain()
                following = await self._next_head(reader)
                if following is None:
                    return  # nothing more was asked on this connection
                head = following
            self.requests += 1
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and int(value):
                    await asyncio.wait_for(reader.readexactly(int(value)), _WAIT_S)
            writer.write(self.head + self.body)
            await writer.drain()
            with suppress(TimeoutError):
                await asyncio.wait_for(self.cut.wait(), _WAIT_S)
        finally:
            # Linger 0: close() sends a reset, as a crashed or killed upstream would.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
