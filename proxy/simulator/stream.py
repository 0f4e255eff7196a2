"""Server-sent events with real pauses, for testing streaming through the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


async def sse_events(
    chunks: list[dict[str, Any]],
    *,
    first_byte_delay_s: float,
    delay_s: float,
    on_abandoned: Callable[[], None] = lambda: None,
    named: bool = False,
) -> AsyncIterator[bytes]:
    """One ``data:`` event per chunk, then ``[DONE]``; ``named`` (the Responses API):
    each event also carries an ``event:`` line with its chunk's ``type``, and no
    ``[DONE]`` follows.

    Each event is yielded separately, so Starlette sends (and the client sees)
    one body frame per chunk; with a delay the pauses are real.
    """
    finished = False
    try:
        if first_byte_delay_s > 0:
            await asyncio.sleep(first_byte_delay_s)
        for i, chunk in enumerate(chunks):
            if i and delay_s > 0:
                await asyncio.sleep(delay_s)
            head = f"event: {chunk['type']}\n".encode() if named else b""
            yield head + b"data: " + orjson.dumps(chunk) + b"\n\n"
        if not named:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            yield DONE
        finished = True
    finally:
        # The client (the proxy, in tests) went away mid-stream: tests assert
        # that a disconnect reaches the upstream promptly.
        if not finished:
            on_abandoned()
