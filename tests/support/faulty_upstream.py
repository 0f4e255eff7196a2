"""A misbehaving upstream for the fault suite: raw asyncio on 127.0.0.1, in a thread of its own.

It does what neither the simulator nor any ASGI app can be made to do: reset a
connection (RST) before or after the headers, answer with bytes that are not
HTTP, hold a request until the proxy gives up on it. Each request is answered
by the behaviour the test sets, one for the proxy's own summary calls (they
carry ``x-compaction-purpose: summarize``) and one for everything else.

It counts what the proxy leaves open: ``open`` connections (accepted, not yet
closed by either side) and ``busy`` ones (a request arrived and its exchange has
neither finished nor seen the proxy hang up). After a case settles, ``busy``
must be 0: a connection the proxy forgot holds an exchange open until
``HOLD_S``. Every wait here is bounded, so a proxy that never closes fails a
test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import orjson

HOLD_S = 20.0  # the longest an exchange waits for the proxy (or the test) to end it
_READ_S = 30.0  # how long an idle keep-alive connection waits for its next request


@dataclass(frozen=True)
class Seen:
    """One request as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def is_summary(self) -> bool:
        return self.headers.get("x-compaction-purpose") == "summarize"

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = orjson.loads(self.body).get("messages", [])
        return messages


class Exchange:
    """One request and the connection its answer goes back on."""

    def __init__(
        self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.seen = seen
        self.reader = reader
        self.writer = writer
        self.keep_alive = True  # read the next request on this connection afterwards

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def reset(self) -> None:
        """Hang up with a RST, as a crashed or killed upstream does."""
        self.keep_alive = False
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    def close(self) -> None:
        """Hang up cleanly (FIN)."""
        self.keep_alive = False
        self.writer.close()

    async def hold(self, release: asyncio.Event) -> bool:
        """Wait until the proxy hangs up (True), ``release`` is set, or ``HOLD_S`` passes."""
        self.keep_alive = False
        eof = asyncio.ensure_future(self.reader.read(1))
        released = asyncio.ensure_future(release.wait())
        done, pending = await asyncio.wait(
            {eof, released}, timeout=HOLD_S, return_when="FIRST_COMPLETED"
        )
        for task in pending:
            task.cancel()
        return (
            eof in done and not eof.cancelled() and eof.exception() is None and eof.result() == b""
        )


Behaviour = Callable[["FaultyUpstream", Exchange], Awaitable[None]]


def handoff(note: str = "none") -> str:
    """A summary the proxy's check keeps (proxy/core/summary_check.py: the headings it asks
    for, none of its instructions' words, not degenerately short), carrying ``note``."""
    return (
        f"## Active task\n{note}\n"
        "## Current state\nThe helper answered each question in turn and the work goes on; "
        "nothing is blocked and no error came up in these turns.\n"
        "## Remaining work\nKeep answering the questions that come next, in the same "
        "tone and at the same length as before, until the conversation ends.\n"
        "## Critical values\nnone"
    )


def completion(text: str = "fine", *, prompt_tokens: int = 10) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-faulty",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": 11},
        }
    )


def chunk_event(text: str) -> bytes:
    delta = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + orjson.dumps({**chunk, "choices": [delta]}) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def response_head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X".encode()]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# Behaviours. Each is a factory: its result answers one exchange.


def answer(
    status: int = 200,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    *,
    delay_s: float = 0.0,
    chunked: bool = False,
) -> Behaviour:
    """A whole answer with a Content-Length, after ``delay_s``; ``chunked``: without one,
    in 64 KiB chunks, so the reader learns its size only by reading it."""
    payload = completion() if body is None else body

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        head = {"content-type": "application/json", **(headers or {})}
        if not chunked:
            head["content-length"] = str(len(payload))
            await ex.send(response_head(status, head) + payload)
            return
        head["transfer-encoding"] = "chunked"
        await ex.send(response_head(status, head))
        step = 64 * 1024
        for at in range(0, len(payload), step):
            await ex.send(_chunked(payload[at : at + step]))
        await ex.send(b"0\r\n\r\n")

    return run


def stream(*events: bytes, then: str = "end", headers: dict[str, str] | None = None) -> Behaviour:
    """A 200 event stream (chunked) of ``events``; ``then``: ``end`` (a clean end of
    the body), ``reset`` (RST after the events) or ``hold`` (wait for the proxy)."""

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        head = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
        await ex.send(response_head(200, {**head, **(headers or {})}))
        for event in events:
            await ex.send(_chunked(event))
            await asyncio.sleep(0.01)  # separate reads on the other side
        if then == "end":
            await ex.send(b"0\r\n\r\n")
        elif then == "reset":
            ex.reset()
        else:
            await upstream.hold(ex)

    return run


def partial(head: bytes, body: bytes, *, then: str) -> Behaviour:
    """Raw ``head`` and ``body`` bytes, then ``reset``, ``close`` or ``hold``."""

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        if head or body:
            await ex.send(head + body)
        if then == "reset":
            ex.reset()
        elif then == "close":
            ex.close()
        else:
            await upstream.hold(ex)

    return run


def gated(behaviour: Behaviour) -> Behaviour:
    """``behaviour``, once the test opens the upstream's gate (at most ``HOLD_S`` later)."""

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        assert upstream._gate is not None
        with suppress(TimeoutError):
            await asyncio.wait_for(upstream._gate.wait(), HOLD_S)
        await behaviour(upstream, ex)

    return run


def in_turn(*behaviours: Behaviour) -> Behaviour:
    """Each behaviour for one request, in order; the last one for every request after."""
    queue = list(behaviours)

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        behaviour = queue.pop(0) if len(queue) > 1 else queue[0]
        await behaviour(upstream, ex)

    return run


def fastapi_validation(then: Behaviour | None = None) -> Behaviour:
    """An upstream built on FastAPI whose request model takes ``content: str`` only: a
    message with any other content gets FastAPI's default answer to a body that fails
    validation (pydantic v2), 422 ``{"detail": [{"type", "loc", "msg", "input"}]}``,
    which echoes the offending value as ``input``; anything else gets ``then``."""
    valid = then or answer()

    async def run(upstream: FaultyUpstream, ex: Exchange) -> None:
        errors = [
            {
                "type": "string_type",
                "loc": ["body", "messages", i, "content"],
                "msg": "Input should be a valid string",
                "input": message.get("content"),
            }
            for i, message in enumerate(ex.seen.messages)
            if not isinstance(message.get("content"), str)
        ]
        if not errors:
            await valid(upstream, ex)
            return
        await answer(422, orjson.dumps({"detail": errors}))(upstream, ex)

    return run


class Firehose:
    """A behaviour: a 200 event stream of ``event`` over and over, written as fast as the
    proxy takes it, up to ``limit`` bytes (then a clean end) or ``HOLD_S``. It counts the
    bytes it wrote (``sent``) and notes when it stopped (``ended``, ``ended_at``) and
    whether that was the proxy hanging up (``hung_up``): how much a proxy pulls for a
    client that left, and how soon it lets go."""

    def __init__(self, event: bytes, limit: int) -> None:
        self.piece = _chunked(event * max(1, 16 * 1024 // len(event)))
        self.limit = limit
        self.sent = 0
        self.hung_up = False
        self.ended = threading.Event()
        self.ended_at = 0.0

    async def __call__(self, upstream: FaultyUpstream, ex: Exchange) -> None:
        ex.keep_alive = False
        head = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
        started = time.monotonic()
        try:
            await ex.send(response_head(200, head))
            while self.sent < self.limit and time.monotonic() - started < HOLD_S:
                if ex.writer.transport.is_closing():
                    self.hung_up = True
                    return
                ex.writer.write(self.piece)
                self.sent += len(self.piece)
                await ex.writer.drain()
            await ex.send(b"0\r\n\r\n")
        except (ConnectionError, OSError):
            self.hung_up = True
        finally:
            self.ended_at = time.monotonic()
            self.ended.set()

    def steady(self, within_s: float = 5.0, quiet_s: float = 0.2) -> int:
        """``sent`` once it stopped growing for ``quiet_s`` (the proxy stopped taking
        bytes), polled for at most ``within_s``."""
        deadline = time.monotonic() + within_s
        last, since = self.sent, time.monotonic()
        while time.monotonic() < deadline and not self.ended.is_set():
            time.sleep(0.02)
            if self.sent != last:
                last, since = self.sent, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
        return self.sent


def hang() -> Behaviour:
    """Read the request, never answer: wait for the proxy to give up."""
    return partial(b"", b"", then="hold")


# What the proxy asks about its models (upstream/discovery.py): answered 404, kept apart.
_NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 23\r\n"
    b'\r\n{"error": "not found"}\n'
)


class FaultyUpstream:
    """The server; ``chat`` and ``summary`` are the behaviours for the next requests."""

    def __init__(self) -> None:
        self.chat: Behaviour = answer()
        self.summary: Behaviour = answer(body=completion(handoff()))
        self.seen: list[Seen] = []
        self.asked: list[str] = []  # the proxy's GETs about its models, answered 404
        self.open = 0
        self.busy = 0
        self.hung_up_on = 0  # holds the proxy ended by closing its connection
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._release: asyncio.Event | None = None
        self._gate: asyncio.Event | None = None

    def __enter__(self) -> FaultyUpstream:
        self._thread.start()
        self._call(self._start()).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        with suppress(Exception):
            self._call(self._stop()).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._release = asyncio.Event()
        self._gate = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1024 * 1024)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await asyncio.wait_for(self._server.wait_closed(), 5)

    def release(self) -> None:
        """End every exchange that holds now (the ones that start later hold again)."""

        def swap() -> None:
            assert self._release is not None
            self._release.set()
            self._release = asyncio.Event()

        self._loop.call_soon_threadsafe(swap)

    def open_gate(self, is_open: bool = True) -> None:
        """Let ``gated`` behaviours go on (or, with False, make them wait again)."""

        def flip() -> None:
            assert self._gate is not None
            if is_open:
                self._gate.set()
            else:
                self._gate.clear()

        self._loop.call_soon_threadsafe(flip)

    async def hold(self, ex: Exchange) -> None:
        assert self._release is not None
        if await ex.hold(self._release):
            self.hung_up_on += 1

    def requests(self, *, summaries: bool = False) -> list[Seen]:
        return [s for s in self.seen if s.is_summary == summaries]

    def settled(self, within_s: float = 30.0) -> bool:
        """Whether no exchange is in progress, polled for at most ``within_s``."""
        deadline = time.monotonic() + within_s
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.busy == 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            while True:
                seen = await _read_request(reader)
                if seen is None:
                    return
                if seen.headers.get("x-compaction-purpose") == "discover":  # none listed
                    self.asked.append(seen.path)
                    writer.write(_NOT_FOUND)
                    await writer.drain()
                    continue
                self.seen.append(seen)
                behaviour = self.summary if seen.is_summary else self.chat
                ex = Exchange(seen, reader, writer)
                self.busy += 1
                try:
                    await behaviour(self, ex)
                except (ConnectionError, OSError):
                    return
                finally:
                    self.busy -= 1
                if not ex.keep_alive:
                    return
        finally:
            self.open -= 1
            writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
        return None
    line, *fields = head.decode("latin-1").split("\r\n")
    method, path, _ = line.split(" ", 2)
    headers: dict[str, str] = {}
    for field in fields:
        if field:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    return Seen(method, path, headers, body)
