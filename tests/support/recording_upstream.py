"""A raw asyncio upstream that keeps every request head and body it reads, counts the
connections it was sent them on, and answers each with a fixed reply."""

from __future__ import annotations

import asyncio
from types import TracebackType

REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class RecordingUpstream:
    def __init__(self, reply: bytes = REPLY) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RecordingUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length, chunked = 0, False
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                    chunked |= name.strip().lower() == b"transfer-encoding"
                body = await (_chunked(reader) if chunked else reader.readexactly(length))
                self.bodies.append(body)
                writer.write(self.reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += (await reader.readexactly(size + 2))[:-2]
    await reader.readexactly(2)
    return body
