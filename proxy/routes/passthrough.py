"""Every other ``/v1/*`` call (models, embeddings, files, ...): relayed untouched.

Its body is read whole when it declares a length up to ``server.max_body_bytes``
(taken from the process's body budget, compaction/inflight.py), streamed through
unbuffered when larger or of unknown length, and absent when it has none.
``extra``: headers worked out from a body read whole (``POST /v1/messages/count_tokens``'s
view count, routes/messages_count.py), while the upstream answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from proxy.errors import ClientDisconnected
from proxy.observe.record import record_of
from proxy.services import Services
from proxy.upstream.relay import buffered, relay
from proxy.upstream.response import UpstreamResponse
from proxy.upstream.urls import passthrough_url

Headers = list[tuple[bytes, bytes]]
Extra = Callable[[bytes], Coroutine[Any, Any, Headers]]
# A 200 JSON answer's body rewritten (None: relayed as it came), read up to its bound.
Rewrite = tuple[Callable[[bytes], bytes | None], int]


async def handle_passthrough(
    request: Request, services: Services, extra: Extra | None = None, rewrite: Rewrite | None = None
) -> Response:
    settings = services.settings
    record = record_of(request)
    scope = request.scope
    url = passthrough_url(
        settings.upstream.base_url, scope["path"], scope.get("raw_path"), scope["query_string"]
    )
    headers = services.headers.outgoing(request.headers.raw)
    try:
        content = await _content(request, services)
        record.sending()
        worked_out: asyncio.Task[Headers] | None = None
        if extra is not None and isinstance(content, bytes):
            worked_out = asyncio.create_task(extra(content))
        try:
            response = await services.client.send(request.method, url, headers, content)
        except BaseException:
            if worked_out is not None:
                worked_out.cancel()
            raise
        record.answered(response.status_code)
    except ClientDisconnect:  # gone mid-body (or cut for stalling): nobody to answer
        raise ClientDisconnected("The client closed the connection.") from None
    headers = await worked_out if worked_out is not None else []
    if rewrite is not None and _rewritable(response):
        return await _rewritten(response, headers, *rewrite)
    return await relay(response, headers)


async def _content(request: Request, services: Services) -> bytes | AsyncIterator[bytes] | None:
    """The body to send: read whole when it declares a length up to ``max_body_bytes``
    (taken from the process's body budget), none when it has none, else streamed."""
    length = request.headers.get("content-length")
    declared = length is not None and length.isascii() and length.isdigit()
    if declared and int(length or 0) <= services.settings.server.max_body_bytes:
        services.bodies.take(request.scope, int(length or 0))
        return await request.body()
    if length is None and "transfer-encoding" not in request.headers:
        return None  # no body: a GET must not go upstream as a chunked upload
    # Unknown or large (file uploads): stream the body through unbuffered.
    return request.stream()


def _rewritable(response: UpstreamResponse) -> bool:
    """A 200 whose body is plain JSON (not compressed: the proxy relays raw bytes)."""
    headers = response.headers
    return (
        response.status_code == 200
        and headers.get("content-encoding", "identity").lower() == "identity"
        and headers.get("content-type", "").lower().startswith("application/json")
    )


async def _rewritten(
    response: UpstreamResponse,
    headers: Headers,
    rewrite: Callable[[bytes], bytes | None],
    limit: int,
) -> Response:
    """``response`` with its body rewritten; past ``limit`` bytes, relayed from what was
    read on, untouched."""
    body, rest = await response.aread_or_rest(limit)
    if rest is not None:
        return await relay(response, headers, started=(body, rest))
    changed = rewrite(body)
    return buffered(response, body if changed is None else changed, headers)
