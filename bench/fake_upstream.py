"""The cheapest OpenAI-shaped upstream we can serve: the floor every benchmark target stands on.

A raw ASGI app under uvicorn (uvloop + httptools, no access log). ``POST .../chat/completions``
answers with precomputed bytes and never parses the request: a fixed JSON completion (a fixed
summary for the proxy's summary calls, told by their header), or, when
the body contains ``"stream": true``, an SSE stream of ``--chunks`` small chunks followed by
``data: [DONE]``. ``--delay-ms`` holds every reply for a fixed time before the first byte, to
stand in for a real model's latency.

    python bench/fake_upstream.py --port 9100 [--delay-ms 50] [--chunks 16]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_CREATED = 1_700_000_000
_REPLY = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": _CREATED,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }
)
_JSON_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_REPLY)).encode()),
]
# The proxy's summary calls (``x-compaction-purpose: summarize``) get a summary that
# passes its checks (core/summary_check.py: every section asked for, some content):
# "ok" is rejected as a summary, and the compacting targets would never hold a snapshot.
_SECTIONS = (
    *("Active task", "Goal", "Constraints and preferences", "Completed actions"),
    *("Current state", "In progress", "Blocked", "Key decisions", "Resolved questions"),
    *("Pending user asks", "Relevant files", "Remaining work", "Critical values"),
)
_SUMMARY_TEXT = "\n".join(
    f"## {name}\nBench line {i}: the load run goes on with its fixed payload."
    for i, name in enumerate(_SECTIONS)
)
_SUMMARY = orjson.dumps(
    {
        "id": "chatcmpl-bench-summary",
        "object": "chat.completion",
        "created": _CREATED,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": _SUMMARY_TEXT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 200, "total_tokens": 210},
    }
)
_SUMMARY_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_SUMMARY)).encode()),
]
_PURPOSE = (b"x-compaction-purpose", b"summarize")
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_NOT_FOUND = b'{"error":{"message":"not found","type":"invalid_request_error"}}'
_NOT_FOUND_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_NOT_FOUND)).encode()),
]
# A cheap bytes search instead of a JSON parse; clients spell it one of these two ways.
_STREAM_MARKERS = (b'"stream":true', b'"stream": true')


def _sse_chunk(delta: dict[str, str], finish_reason: str | None) -> bytes:
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def sse_chunks(count: int) -> list[bytes]:
    """One streamed reply: ``count`` data events (role, content, stop), then ``[DONE]``."""
    chunks = [_sse_chunk({"role": "assistant", "content": ""}, None)]
    chunks += [_sse_chunk({"content": f"tok{i} "}, None) for i in range(max(count - 2, 0))]
    chunks.append(_sse_chunk({}, "stop"))
    chunks.append(b"data: [DONE]\n\n")
    return chunks


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


def create_app(delay_s: float, chunk_count: int) -> App:
    """An ASGI app that answers chat completions after ``delay_s`` seconds."""
    stream_chunks = sse_chunks(chunk_count)
    last = len(stream_chunks) - 1

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await send(
                {"type": "http.response.start", "status": 404, "headers": _NOT_FOUND_HEADERS}
            )
            await send({"type": "http.response.body", "body": _NOT_FOUND})
            return
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if not any(marker in body for marker in _STREAM_MARKERS):
            if _PURPOSE in scope["headers"]:
                start = {"type": "http.response.start", "status": 200, "headers": _SUMMARY_HEADERS}
                await send(start)
                await send({"type": "http.response.body", "body": _SUMMARY})
                return
            await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEADERS})
            await send({"type": "http.response.body", "body": _REPLY})
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        for i, chunk in enumerate(stream_chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < last})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="hold each reply this long")
    parser.add_argument("--chunks", type=int, default=16, help="SSE events per streamed reply")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.delay_ms / 1000, args.chunks),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        # Proxies keep pooled connections idle while other targets are measured.
        timeout_keep_alive=300,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
