"""The request bodies one worker process holds at once (``server.max_inflight_body_bytes``),
and reading one (``read_body``, step 1 of every compacting API).

A body the proxy reads whole (a chat or responses body, a passthrough body of a
declared length up to ``max_body_bytes``) takes its bytes from the budget before they
are read: its declared Content-Length up front, else each chunk as it arrives. A body
that would take the total over the budget gets ``Overloaded`` (503, Retry-After) and is
never read (uvicorn discards what the client still sends once the answer is out).
What a request took returns when it ends, answered, failed or abandoned by its
client: ``endpoint`` calls ``release`` in a ``finally``, since the body and what was
parsed from it live until the response is sent, streams included.

Bodies the proxy streams through without holding them (passthrough uploads larger
than ``max_body_bytes`` or of unknown length) take nothing: flow control holds at
most a chunk of each, and ``server.max_client_connections`` bounds how many.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from starlette.requests import Request

from proxy.config import ServerSettings
from proxy.errors import ClientDisconnected, Overloaded, PayloadTooLarge, UnsupportedEncoding
from proxy.shortcuts.starlette_request import consumed

# The scope key under which a request's hold is kept (absent: it took nothing).
_HELD = "proxy.body_budget"


class _Hold:
    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0


class BodyBudget:
    """Bytes of request bodies held by this process's requests in flight."""

    __slots__ = ("limit", "used")

    def __init__(self, server: ServerSettings) -> None:
        configured = server.max_inflight_body_bytes
        # Never below one allowed body, or a lone largest body could never be served.
        self.limit = max(configured or 4 * server.max_body_bytes, server.max_body_bytes)
        self.used = 0

    def take(self, scope: MutableMapping[str, Any], size: int) -> None:
        """Count ``size`` more bytes against the request of ``scope``, or raise
        ``Overloaded`` (counting nothing) if they would take the total over the limit."""
        if not size:  # an empty body holds nothing: no hold to keep
            return
        if self.used + size > self.limit:
            raise Overloaded(
                "The proxy is holding as many request bodies as it may; retry shortly."
            )
        hold = scope.get(_HELD)
        if hold is None:
            hold = scope[_HELD] = _Hold(self)
        hold.size += size
        self.used += size


def release(scope: MutableMapping[str, Any]) -> None:
    """Return what the request of ``scope`` took; called once, as it ends."""
    hold: _Hold | None = scope.pop(_HELD, None)
    if hold is not None:
        hold.budget.used -= hold.size


async def read_body(request: Request, limit: int, budget: BodyBudget | None = None) -> bytes:
    """The request's body, read whole and bounded by ``limit``, its bytes taken from
    ``budget`` before they are read. A compressed body is refused, not decoded: the
    proxy reads the JSON and may send a rewritten body upstream, where the client's
    Content-Encoding header would then lie; the official SDKs never compress, and
    inflating is memory and CPU a hostile body could make unbounded."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding[:40]!r} is not supported on this endpoint; "
            "send the JSON body uncompressed.",
            param="content-encoding",
        )
    declared = request.headers.get("content-length", "")
    # isdigit() alone accepts '²', which int() rejects.
    length = int(declared) if declared.isascii() and declared.isdigit() else None
    if length is not None and length > limit:
        raise _too_large(limit)
    scope = request.scope
    # Declared: taken whole before a byte is read; else chunk by chunk as they arrive.
    per_chunk = budget if length is None else None
    if budget is not None and length is not None:
        budget.take(scope, length)
    chunks: list[bytes] = []
    size = 0
    # ``receive`` itself, as ``Request.stream()`` reads it, without that async generator
    # (its creation, finalizer hooks and one step per chunk: once a request).
    receive, more = request.receive, True
    while more:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            # The client left or was dropped for stalling (server.body_timeout_s).
            raise ClientDisconnected("The client disconnected while sending its body.")
        if kind != "http.request":
            continue
        more = message.get("more_body", False)
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            if per_chunk is not None:
                per_chunk.take(scope, len(chunk))
            chunks.append(chunk)
    consumed(request)  # as stream() leaves it: a second read is an error
    return b"".join(chunks)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body is larger than the proxy's limit of {limit} bytes.")
