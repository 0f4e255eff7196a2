"""The head of a 200 event stream: held until its first event shows whether it is an
overflow error (step 10), its comments relayed meanwhile.

Some servers report an overflow as a 200 stream's first event, so the proxy reads
a stream's head up to that event to recover before the client sees any. A model
that thinks for long sends comments first (OpenRouter: ``: OPENROUTER PROCESSING``
every second); held back, they would reach the client only with the first event,
and a load balancer's idle timeout could cut the connection meanwhile. So once a
comment arrives the response starts: status 200 and the upstream's headers go out,
then each comment as it comes, byte for byte. Events stay held (Responses'
``response.created`` and ``in_progress`` too) until the first one that carries
output decides. If that one is an overflow the client has seen no event yet, so
the retry's events continue the same response: its status and headers cannot be
sent again (the response's headers describe the first attempt), its comments and
events are relayed as received. A retry that fails ends the stream with one error
event in the API's shape, carrying the upstream's error object when it sent one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.background import BackgroundTask

from proxy.core.outcome import Outcome
from proxy.errors import ProxyError
from proxy.upstream.api import Attempt
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.headers import response_headers
from proxy.upstream.overflow import Overflow, classify_error
from proxy.upstream.relay import Relaying

log = logging.getLogger("proxy.recover")

# Past this much head without a first event, the stream is not one we can classify.
MAX_HEAD_BYTES = 256 * 1024
# Events that open a stream before any output: Responses' lifecycle, and a Messages
# stream's message_start and ping (an error event may follow them).
_PREAMBLE = (
    b"response.created",
    b"response.in_progress",
    b"response.queued",
    b"message_start",
    b"ping",
)
_BLOCK_END = re.compile(rb"\r?\n\r?\n")

Watch = Callable[[bytes], None]


@dataclass(slots=True)
class Held:
    """A 200 stream whose comments came before its first event: what was read of it,
    none of it sent yet, and the iterator for the rest."""

    response: UpstreamResponse
    head: bytes
    source: AsyncIterator[bytes]
    status_code: int = 200


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a held stream needs from the pipeline to recover in-stream."""

    # Compact harder and send once more: its answer, and what it sent; None when nothing
    # can change.
    retry: Callable[[Overflow], Awaitable[tuple[UpstreamResponse, Attempt] | None]]
    watch_for: Callable[[Outcome], Watch | None]  # the usage watcher for a view's answer
    stream_error: Callable[[dict[str, Any]], bytes]  # an error object as the API's event
    answered: Callable[[int, Outcome], None]  # the request's record
    failure: Callable[[bytes], bytes | None]  # the head's error event: the API's (api.py)


def first_event(head: bytes) -> bytes | None:
    """The stream's first complete event that is not only comments nor a stream's
    preamble (Responses' lifecycle, Messages' ``message_start`` and ``ping``), or None if
    none is complete yet."""
    events = head.replace(b"\r\n", b"\n").split(b"\n\n")
    for event in events[:-1]:  # the last piece has no blank line after it yet
        lines = [line for line in event.split(b"\n") if line and not line.startswith(b":")]
        if lines and not _is_preamble(lines):
            return b"\n".join(lines)
    return None


def _is_preamble(lines: list[bytes]) -> bool:
    """A Responses stream opens with ``response.created`` (and ``in_progress``), a
    Messages stream with ``message_start`` and ``ping``, which carry no output: an
    overflow comes after them, as ``response.failed`` or an ``error`` event."""
    for line in lines:
        if line.startswith(b"event:"):
            return line[6:].strip() in _PREAMBLE
    data = next((line[5:].strip() for line in lines if line.startswith(b"data:")), b"")
    return any(data.startswith(b'{"type":"' + kind + b'"') for kind in _PREAMBLE)


def error_event(head: bytes) -> bytes | None:
    """The data of the stream's first event when that event is an error."""
    event = first_event(head)
    if event is None or (b"error" not in event and b"failed" not in event):
        return None  # the common case: a chunk of the answer, decided without parsing
    kind = b""
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            kind = line[6:].strip()
        elif line.startswith(b"data:"):
            data.append(line[5:].strip())
    payload = b"\n".join(data)
    if kind in (b"error", b"response.failed"):
        return payload
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and "error" in parsed and "choices" not in parsed:
        return payload
    if isinstance(parsed, dict) and parsed.get("type") in ("error", "response.failed"):
        return payload
    return None


def comments_ahead(pending: bytes) -> tuple[bytes, bytes]:
    """The complete comment-only blocks of ``pending`` before its first event (to send
    now, as received), and the rest in order (held: lifecycle events, a partial block,
    the first event and what follows it)."""
    out: list[bytes] = []
    kept: list[bytes] = []
    at = 0
    for end in _BLOCK_END.finditer(pending):
        start, at = at, end.end()
        block = pending[start:at]
        lines = [line for line in block.splitlines() if line]
        if all(line.startswith(b":") for line in lines):
            out.append(block)
        elif _is_preamble(lines):
            kept.append(block)
        else:
            kept.append(pending[start:])
            return b"".join(out), b"".join(kept)
    kept.append(pending[at:])
    return b"".join(out), b"".join(kept)


def respond(held: Held, recovery: Recovery, first: Attempt) -> Relaying:
    """The response for ``held`` (the answer to ``first``): its headers and comments now,
    then its events, or after an overflow in its first event, the retry's; once a model's
    answer has ended, the follow-ups of the attempt it answers. The caller adds the view's
    headers."""
    state = _State(held.response, first)
    out = Relaying(
        _body(held, recovery, state), status_code=200, background=BackgroundTask(state.finish)
    )
    out.raw_headers = response_headers(held.response)
    return out


@dataclass(slots=True)
class _State:
    """The answer being relayed (the first, or the retry's) and the attempt it answers."""

    response: UpstreamResponse
    sent: Attempt
    ok: bool = True  # the answer relayed is the model's (not an error): follow-ups after

    async def finish(self) -> None:
        await self.response.aclose()
        if self.ok:  # its follow-ups in order (a sighting, pre-compaction), once it is out
            for follow_up in self.sent.follow_ups:
                await follow_up()


async def _body(held: Held, recovery: Recovery, state: _State) -> AsyncGenerator[bytes, None]:
    outcome = state.sent.outcome
    head = unsent = held.head
    source = held.source
    relaying = False  # an event went out: a failure can only end the stream now
    try:
        while True:
            comments, unsent = comments_ahead(unsent)
            if comments:
                yield comments
            if first_event(head) is not None or len(head) > MAX_HEAD_BYTES:
                break
            chunk = await anext(source, None)
            if chunk is None:  # the stream ended before any event: relay what it said
                yield unsent
                return
            head += chunk
            unsent += chunk
        verdict = _recoverable(held, recovery, head)
        if verdict is None:  # not ours: relay it as it came
            relaying = True
            async for piece in _relayed(unsent, source, recovery.watch_for(outcome)):
                yield piece
            return
        await held.response.aclose()
        retried = await recovery.retry(verdict)
        if retried is None:  # nothing to change: the upstream's own error event
            yield unsent
            state.ok = False
            return
        state.response, state.sent = retried
        retry = state.response
        recovery.answered(retry.status_code, state.sent.outcome)
        if retry.status_code == 200 and _is_stream(retry):
            relaying = True
            watch = recovery.watch_for(state.sent.outcome)
            async for piece in _relayed(b"", retry.aiter_raw(), watch):
                yield piece
            return
        state.ok = False
        yield recovery.stream_error(await _error_object(retry))
    except ProxyError as exc:
        state.ok = False
        if relaying:  # events went out: end the stream early, cleanly, as relay.py does
            log.warning("upstream stream broke mid-body: %s", type(exc.__cause__).__name__)
            return
        yield recovery.stream_error(orjson.loads(exc.body())["error"])
    finally:
        # As relay.py: a client that went away closes the upstream call it was reading.
        await held.response.aclose()
        await state.response.aclose()


def _recoverable(held: Held, recovery: Recovery, head: bytes) -> Overflow | None:
    """The overflow the stream's ``head`` opens with, when its first event is one the
    proxy recovers; None for any other stream."""
    error = recovery.failure(head)
    verdict = None if error is None else classify_error(400, held.response.headers, error)
    return None if verdict is None or verdict.kind == "other" else verdict


async def _relayed(
    prefix: bytes, source: AsyncIterator[bytes], watch: Watch | None
) -> AsyncIterator[bytes]:
    if prefix:
        if watch is not None:
            watch(prefix)
        yield prefix
    async for chunk in source:
        if watch is not None:
            watch(chunk)
        yield chunk


def _is_stream(response: UpstreamResponse) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


async def _error_object(response: UpstreamResponse) -> dict[str, Any]:
    """The upstream's own error object when its answer has one, else one that names
    its status: what a client would have got as the retry's status and body."""
    raw = b""
    async for chunk in response.aiter_raw():
        raw += chunk
        if len(raw) > MAX_HEAD_BYTES:
            break
    await response.aclose()
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return dict(parsed["error"])
    status = response.status_code
    message = f"The upstream answered HTTP {status} to the retry after a context overflow."
    return {"message": message, "type": "upstream_error", "param": None, "code": None}
