"""Relaying an upstream answer to the client: status, headers and bytes as received.

A stream that breaks after its first byte ends the client's stream early and
cleanly, with one warning line. What follows an answer (``run_after``: a sighting,
pre-compaction, the output items kept) runs once it is out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from starlette.background import BackgroundTask, BackgroundTasks
from starlette.responses import Response

from proxy.errors import UpstreamStreamBroken
from proxy.shortcuts.starlette_response import Relaying as Relaying
from proxy.shortcuts.starlette_response import peeked, whole
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.headers import response_headers

# Named for what broke (the upstream's answer), as it was before relaying had a module.
log = logging.getLogger("proxy.upstream")

# Responses bigger than this (or of unknown size) are streamed, not buffered.
_BUFFER_LIMIT = 1024 * 1024


class Rewrite(Protocol):
    """An answer the proxy edits on its way out (routes/messages_answers.py: Anthropic's
    ``context_management`` carried out): a body read whole, or a stream as it comes."""

    def whole(self, body: bytes) -> bytes: ...

    def stream(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]: ...


def buffered(
    response: UpstreamResponse, body: bytes, extra_headers: Iterable[tuple[bytes, bytes]] = ()
) -> Response:
    """An upstream answer whose raw body was already read: relay it as received."""
    length = (b"content-length", str(len(body)).encode())
    headers = [*response_headers(response), *extra_headers, length]
    return whole(body, response.status_code, headers)


async def relay(
    response: UpstreamResponse,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
    watch: Callable[[bytes], None] | None = None,
    started: tuple[bytes, AsyncIterator[bytes]] | None = None,
    rewrite: Rewrite | None = None,
) -> Response:
    """Turn an upstream response into ours: status, headers and bytes as received.

    Event streams and large bodies are relayed chunk by chunk as they arrive;
    small bodies are read whole, which is cheaper than streaming them.
    ``watch`` sees the body's bytes (each chunk of a stream) on their way out.
    ``started``: bytes the caller already read, and the iterator it read them from.
    ``rewrite``: the bytes as the proxy edits them (``watch`` still sees the upstream's);
    an answer with a ``content-encoding`` goes as it came.
    """
    headers = response_headers(response)
    headers.extend(extra_headers)
    if rewrite is not None and response.headers.get("content-encoding", "identity") != "identity":
        log.warning("an encoded answer relayed unedited")
        rewrite = None
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
        body = body if rewrite is None else rewrite.whole(body)
        headers.append((b"content-length", str(len(body)).encode()))
        return whole(body, response.status_code, headers)
    chunks: AsyncGenerator[bytes, None] = _raw_chunks(response, watch, started)
    if rewrite is not None:
        chunks = rewrite.stream(chunks)
    if started is not None and started[0]:  # the head peeked for an overflow: out first
        return peeked(chunks, response, headers)
    out = Relaying(
        chunks,
        status_code=response.status_code,
        background=BackgroundTask(response.aclose),
    )
    out.raw_headers = headers
    return out


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


def run_after(response: Response, follow_ups: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``follow_ups`` one after the other, in order, once ``response`` has been sent
    (a stream: once it has ended), after the response's own background work (closing
    the upstream answer)."""
    tasks = BackgroundTasks()
    if response.background is not None:
        tasks.add_task(response.background)
    for follow_up in follow_ups:
        tasks.add_task(follow_up)
    response.background = tasks
