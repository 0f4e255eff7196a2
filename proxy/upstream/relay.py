"""Relaying an upstream answer to the client: status, headers and bytes as received.

A stream that breaks after its first byte ends the client's stream early and
cleanly, with one warning line.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.errors import UpstreamStreamBroken
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.headers import response_headers

# Named for what broke (the upstream's answer), as it was before relaying had a module.
log = logging.getLogger("proxy.upstream")

# Responses bigger than this (or of unknown size) are streamed, not buffered.
_BUFFER_LIMIT = 1024 * 1024


class Relayed(Response):
    """A body read whole, with the headers it goes out with: ``Response``'s own
    constructor renders and builds headers that relaying would only replace."""

    def __init__(self, body: bytes, status_code: int, raw_headers: list[tuple[bytes, bytes]]):
        self.status_code = status_code
        self.background = None
        self.body = body
        self.raw_headers = raw_headers


def buffered(
    response: UpstreamResponse, body: bytes, extra_headers: Iterable[tuple[bytes, bytes]] = ()
) -> Response:
    """An upstream answer whose raw body was already read: relay it as received."""
    length = (b"content-length", str(len(body)).encode())
    headers = [*response_headers(response), *extra_headers, length]
    return Relayed(body, response.status_code, headers)


async def relay(
    response: UpstreamResponse,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
    watch: Callable[[bytes], None] | None = None,
    started: tuple[bytes, AsyncIterator[bytes]] | None = None,
) -> Response:
    """Turn an upstream response into ours: status, headers and bytes as received.

    Event streams and large bodies are relayed chunk by chunk as they arrive;
    small bodies are read whole, which is cheaper than streaming them.
    ``watch`` sees the body's bytes (each chunk of a stream) on their way out.
    ``started``: bytes the caller already read, and the iterator it read them from.
    """
    headers = response_headers(response)
    headers.extend(extra_headers)
    started = started or response.started
    length = response.headers.get("content-length")
    is_stream = response.headers.get("content-type", "").startswith("text/event-stream")
    small = (
        length is not None
        and length.isascii()
        and length.isdigit()
        and int(length) <= _BUFFER_LIMIT
    )
    if not is_stream and small and started is None:
        # Raw bytes (auto_decompress is off): the content-encoding header is
        # relayed, so must the encoding be.
        body = await response.aread_closed()
        if watch is not None:
            watch(body)
        headers.append((b"content-length", str(len(body)).encode()))
        return Relayed(body, response.status_code, headers)
    if started is not None and started[0]:  # the head peeked for an overflow: out first
        return Streamed(_raw_chunks(response, watch, started), response, headers)
    out = Relaying(
        _raw_chunks(response, watch, started),
        status_code=response.status_code,
        background=BackgroundTask(response.aclose),
    )
    out.raw_headers = headers
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
    of the loop (issue 27). The rest, the disconnect and the background as its base's."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        response: UpstreamResponse,
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


async def _raw_chunks(
    response: UpstreamResponse,
    watch: Callable[[bytes], None] | None,
    started: tuple[bytes, AsyncIterator[bytes]] | None = None,
) -> AsyncGenerator[bytes, None]:
    # Bytes exactly as received (no decompression, no re-serialization). If the
    # client disconnects, Starlette cancels this generator and the finally
    # closes the upstream connection, which cancels the upstream request.
    prefix, source = started if started is not None else (b"", response.aiter_raw())
    try:
        if prefix:
            if watch is not None:
                watch(prefix)
            yield prefix
        async for chunk in source:
            if watch is not None:
                watch(chunk)
            yield chunk
    except UpstreamStreamBroken as exc:
        # Headers are already sent: all we can do is end the stream early, cleanly,
        # so the client keeps what it got. The cause names a timeout or a lost connection.
        log.warning("upstream stream broke mid-body: %s", type(exc.__cause__).__name__)
    finally:
        await response.aclose()
