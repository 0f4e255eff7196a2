"""Answers relayed to the client as Starlette responses: a body read whole, and streams.

``Relayed`` is a ``Response`` built without ``Response.__init__`` (which renders a body
and builds headers that relaying would only replace), and ``Streamed`` sends a peeked
stream's first bytes before ``StreamingResponse.__call__``'s set-up: both follow Starlette
1.10's ``Response`` step for step, so ``whole()`` and ``peeked()`` make them on that series
and the public constructors' answers otherwise (the same bytes). ``Relaying``, the stream
both paths use, is not a shortcut: it overrides two of ``StreamingResponse``'s methods for
what it does (stop reading once the client is gone), on every release.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.shortcuts.gate import on


class Source(Protocol):
    """The upstream answer a stream relays (upstream/response.py ``UpstreamResponse``)."""

    @property
    def status_code(self) -> int: ...

    async def aclose(self) -> None: ...


class Relayed(Response):
    """A body read whole, with the headers it goes out with: ``Response``'s own
    constructor renders and builds headers that relaying would only replace."""

    def __init__(self, body: bytes, status_code: int, raw_headers: list[tuple[bytes, bytes]]):
        self.status_code = status_code
        self.background = None
        self.body = body
        self.raw_headers = raw_headers


def whole(body: bytes, status_code: int, raw_headers: list[tuple[bytes, bytes]]) -> Response:
    """A response of ``body`` with exactly ``raw_headers`` (its content-length among them)."""
    if on("starlette"):
        return Relayed(body, status_code, raw_headers)
    out = Response(body, status_code)
    out.raw_headers = raw_headers
    return out


def peeked(
    chunks: AsyncGenerator[bytes, None], response: Source, raw_headers: list[tuple[bytes, bytes]]
) -> Relaying:
    """The stream of ``chunks`` (its first already read from ``response``), which closes
    ``response`` when done: out before the task group on the tested series."""
    if on("starlette"):
        return Streamed(chunks, response, raw_headers)
    out = Relaying(chunks, response.status_code, background=BackgroundTask(response.aclose))
    out.raw_headers = raw_headers
    return out


class Relaying(StreamingResponse):
    """A stream relayed as it comes, that stops reading its source once the client is gone.

    Starlette notices the disconnect (its listener's ``receive``) and cancels the relaying
    task; but that cancellation lands only while the task waits, and a task whose upstream
    always has the next bytes ready is never found waiting (anyio does not cancel a task
    whose wait is already over), so it would read the rest of the stream for no one,
    since sends to a closed connection return at once. The listener's flag is checked
    between chunks instead: one attribute read a chunk. ``chunks`` is an async generator,
    closed here when the client leaves, which closes the upstream's connection."""

    gone = False  # the client disconnected (set by the listener)

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        status_code: int = 200,
        background: BackgroundTask | None = None,
    ) -> None:
        super().__init__(chunks, status_code, background=background)
        self._chunks = chunks

    async def listen_for_disconnect(self, receive: Receive) -> None:
        await super().listen_for_disconnect(receive)
        self.gone = True

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await self.relay_body(send)

    async def relay_body(self, send: Send) -> None:
        """The body's chunks as they come, then its end; or, once the client is gone,
        nothing more (the source closed)."""
        chunks = self._chunks
        async for chunk in chunks:
            if self.gone:
                await chunks.aclose()
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Streamed(Relaying):
    """A stream whose first bytes were read already (its head, peeked for an overflow):
    its status, headers and those bytes go out as soon as it is called, before the
    task group that relays the rest and listens for a disconnect (starlette's, under
    ASGI < 2.4) is set up, so the client's first byte waits for neither that nor a turn
    of the loop. The rest, the disconnect and the background as its base's."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        response: Source,
        raw_headers: list[tuple[bytes, bytes]],
    ) -> None:
        # The base's own set-up (what a starlette upgrade adds there comes along), then
        # the upstream's headers as they are.
        super().__init__(chunks, response.status_code, background=BackgroundTask(response.aclose))
        self.upstream = response
        self.raw_headers = raw_headers
        self.started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        try:
            await send({**start, "headers": self.raw_headers})
            self.started = True
            head = await anext(self._chunks)  # read already: yielded at once
            await send({"type": "http.response.body", "body": head, "more_body": True})
        except BaseException:  # the client is gone (an ASGI 2.4 server raises): free it
            await self.upstream.aclose()
            raise
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        if not self.started:  # (a websocket scope: never one of ours)
            await super().stream_response(send)
            return
        await self.relay_body(send)
