"""Server-sent events with real pauses, for testing streaming through the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import StreamingResponse

from proxy.simulator.overrides import Overrides

if TYPE_CHECKING:
    from proxy.simulator.state import Simulator

DONE = b"data: [DONE]\n\n"
COMMENT = b": PROCESSING\n\n"


def with_thinking(
    events: AsyncIterator[bytes],
    overrides: Overrides,
    on_abandoned: Callable[[], None] = lambda: None,
) -> AsyncIterator[bytes]:
    """``events``, opened by comments when ``X-Sim-Thinking-Ms`` asks for them; a client
    that leaves meanwhile is counted by ``on_abandoned``, as one that leaves mid-stream."""
    if not overrides.thinking_ms:
        return events
    every = overrides.comment_interval_ms
    return thinking_first(
        events,
        for_s=overrides.thinking_ms / 1000,
        every_s=(1000 if every is None else every) / 1000,
        on_abandoned=on_abandoned,
    )


def named_stream(
    events: list[dict[str, Any]], sim: Simulator, overrides: Overrides
) -> StreamingResponse:
    """``events`` as a named event stream (the Responses and Messages APIs), paced by
    the simulator's stream settings and opened by thinking comments when asked."""
    settings = sim.config.stream
    chunks = sse_events(
        events,
        first_byte_delay_s=settings.first_byte_delay_ms / 1000,
        delay_s=settings.delay_ms / 1000,
        on_abandoned=lambda: sim.recorder.bump("streams_abandoned"),
        named=True,
    )
    return StreamingResponse(
        with_thinking(chunks, overrides),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def thinking_first(
    events: AsyncIterator[bytes],
    *,
    for_s: float,
    every_s: float,
    on_abandoned: Callable[[], None] = lambda: None,
) -> AsyncIterator[bytes]:
    """``events`` after ``for_s`` seconds of thinking, during which an SSE comment goes
    out every ``every_s`` (the first at once), as OpenRouter sends ``: PROCESSING``
    while a model thinks."""
    thought = False
    try:
        loop = asyncio.get_running_loop()
        until = loop.time() + for_s
        while (left := until - loop.time()) > 0:
            yield COMMENT
            await asyncio.sleep(min(every_s, left) if every_s > 0 else left)
        thought = True
    finally:
        if not thought:  # the client left while the model was thinking
            on_abandoned()
    async for event in events:
        yield event


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
