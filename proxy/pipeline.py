"""The request's path through the proxy, top to bottom.

``handle_chat`` is the table of contents for ``POST /v1/chat/completions``;
``handle_passthrough`` relays every other ``/v1/*`` call untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from proxy import upstream
from proxy.calibrate import find_prompt_tokens
from proxy.compact import Outcome, Turn
from proxy.disconnect import cancelled_on_disconnect
from proxy.errors import ClientDisconnected
from proxy.models import ResolvedModel
from proxy.parse import parse_chat_request, read_body
from proxy.recover import RECOVERABLE, Attempt, retry_on_overflow
from proxy.services import Services
from proxy.session import tenant_from_headers

# Bodies above this are parsed in a worker thread, so the loop keeps serving others.
_PARSE_INLINE_BYTES = 1024 * 1024


async def handle_chat(request: Request, services: Services) -> Response:
    settings = services.settings
    body = await read_body(request, settings.server.max_body_bytes)  # 1. parse
    if len(body) > _PARSE_INLINE_BYTES:  # tens of ms (seconds, if hostile) of orjson
        chat = await asyncio.to_thread(parse_chat_request, body, settings.server.max_messages)
    else:
        chat = parse_chat_request(body, settings.server.max_messages)
    tenant = tenant_from_headers(request.headers)
    model = await effective_model(services, chat["model"], tenant)  # 2.
    headers = services.headers.outgoing(request.headers.raw, inspect=True)
    control = request.headers.get("x-compaction", "").strip().lower()
    turn = Turn(
        chat=chat,
        body=body,
        model=model,
        tenant=tenant,
        session_header=request.headers.get(settings.session.header),
        auth_headers=services.headers.auth_only(headers),
    )

    estimate = len(body) // 4
    if control == "off":
        outcome = Outcome("bypassed", None, 0, estimate, model.context_window, counted=False)
    elif not settings.compaction.enabled:
        outcome = Outcome("passthrough", None, 0, estimate, model.context_window, counted=False)
    else:  # 3-8. session, snapshot, count, plan, summarize, rebuild
        outcome = await services.compactor.prepare(turn, force=control == "force")
    if outcome.messages is not None:
        body = orjson.dumps({**chat, "messages": outcome.messages})

    url = upstream.upstream_url(settings.upstream.base_url, "chat/completions", b"")
    try:
        # Until the answer's bytes flow, only this notices a client that gave up.
        async with cancelled_on_disconnect(request.receive):
            response = await services.client.send("POST", url, headers, body)  # 9.
            answer: upstream.UpstreamResponse | Response = response
            recover = control != "off" and settings.compaction.recover_overflow
            status = response.status_code
            # 10. overflow: an error answer, or a stream that opens with one: retry once
            if recover and (status in RECOVERABLE or (status == 200 and chat.get("stream"))):
                answer, outcome = await retry_on_overflow(
                    services, turn, Attempt(body, outcome), response, headers, url
                )
            services.metrics.requests.labels(status=outcome.status).inc()
            if isinstance(answer, upstream.UpstreamResponse):
                ok = answer.status_code == 200
                watch = _usage_watcher(services, tenant, model.name, outcome) if ok else None
                return await upstream.relay(answer, outcome.headers(), watch)
    except ClientDisconnected:
        services.metrics.client_disconnects.labels(phase="upstream").inc()
        raise
    answer.raw_headers.extend(outcome.headers())  # an error answer, already read
    return answer


async def effective_model(services: Services, name: str, tenant: str) -> ResolvedModel:
    """The model's spec with the one window every step and every response uses: the
    configured window in our token units for this tenant (calibration), or the smaller
    window learned from the upstream's overflow errors."""
    model = services.compactor.calibration.apply(services.models.resolve(name), tenant)
    return await services.windows.apply(model, tenant)


def _usage_watcher(
    services: Services, tenant: str, model: str, outcome: Outcome
) -> Callable[[bytes], None] | None:
    """Feed the provider's prompt token count back into our estimates."""
    if not outcome.counted:
        return None
    calibration = services.compactor.calibration

    def watch(chunk: bytes) -> None:
        theirs = find_prompt_tokens(chunk)
        if theirs is not None:
            calibration.observe(tenant, model, outcome.tokens, theirs)

    return watch


async def handle_passthrough(request: Request, services: Services) -> Response:
    settings = services.settings
    scope = request.scope
    url = upstream.passthrough_url(
        settings.upstream.base_url, scope["path"], scope.get("raw_path"), scope["query_string"]
    )
    headers = services.headers.outgoing(request.headers.raw)
    length = request.headers.get("content-length")
    content: bytes | AsyncIterator[bytes] | None
    declared = length is not None and length.isascii() and length.isdigit()
    try:
        if declared and int(length or 0) <= settings.server.max_body_bytes:
            content = await request.body()
        elif length is None and "transfer-encoding" not in request.headers:
            content = None  # no body: a GET must not go upstream as a chunked upload
        else:
            # Unknown or large (file uploads): stream the body through unbuffered.
            content = request.stream()
        response = await services.client.send(request.method, url, headers, content)
    except ClientDisconnect:  # gone mid-body (or cut for stalling): nobody to answer
        raise ClientDisconnected("The client closed the connection.") from None
    return await upstream.relay(response)
