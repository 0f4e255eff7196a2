"""The leanest correct starlette + aiohttp passthrough: the floor the proxy's goals count against.

It does what any proxy of chat completions must, and nothing more:

- a ``POST`` to ``…/chat/completions`` has its JSON body parsed and re-serialized with orjson
  (the proxy must read the messages to count them; a body that is not a JSON object gets a 400);
  any other request's body goes as received;
- request headers go upstream minus hop-by-hop, host and content-length;
- a non-streamed reply (not ``text/event-stream``) is read whole and answered with one plain
  ``Response``: no ``StreamingResponse``, no background task;
- a streamed reply is relayed chunk by chunk as it arrives, and the upstream connection is
  released when the stream ends or the client goes.

``passthrough.py --client aiohttp`` (the earlier floor) answers every reply, streamed or not,
through a ``StreamingResponse`` with a background task that releases the upstream response:
per non-streamed reply that is an async generator, a separate ``http.response.body`` message
per chunk plus the closing empty one, and the task's run after the body is sent.

    python bench/passthrough_lean.py --port 9200 --upstream http://127.0.0.1:9100/v1
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TypedDict

import aiohttp
import orjson
import uvicorn
from passthrough import _DROP_REQUEST, _HOP_BY_HOP, _TIMEOUT_S, POOL_SIZE
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# The pool, timeout and dropped request headers are the old floor's (passthrough.py): the
# two differ only in how they relay an answer. Our server adds its own date and server;
# ``Response`` sets content-length for the body it sends, and a stream goes out chunked.
_DROP_REPLY = _HOP_BY_HOP | {"date", "server", "content-length"}
_BAD_BODY = b'{"error":{"message":"the body is not a JSON object","type":"invalid_request_error"}}'


class State(TypedDict):
    session: aiohttp.ClientSession


def _keep(headers: Mapping[str, str], drop: frozenset[str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in drop}


async def _chunks(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    # If the client goes, starlette cancels this generator and the finally frees the connection.
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk
    finally:
        upstream.release()


def create_app(upstream_url: str) -> Starlette:
    """A passthrough to ``upstream_url`` (a base URL such as ``http://host:port/v1``)."""
    base_url = upstream_url.rstrip("/")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL_SIZE, limit_per_host=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=_TIMEOUT_S),
        ) as session:
            yield {"session": session}

    async def passthrough(request: Request) -> Response:
        path: str = request.path_params["path"]
        body = await request.body()
        if request.method == "POST" and path.endswith("chat/completions"):
            try:
                chat = orjson.loads(body)
            except orjson.JSONDecodeError:
                chat = None
            if not isinstance(chat, dict):
                return Response(_BAD_BODY, 400, media_type="application/json")
            body = orjson.dumps(chat)
        query = request.url.query
        session: aiohttp.ClientSession = request.state.session
        upstream = await session.request(
            request.method,
            f"{base_url}/{path}" + (f"?{query}" if query else ""),
            headers=_keep(request.headers, _DROP_REQUEST),
            data=body,
        )
        headers = _keep(upstream.headers, _DROP_REPLY)
        if upstream.content_type == "text/event-stream":
            return StreamingResponse(_chunks(upstream), upstream.status, headers)
        # read() releases the connection to the pool once the body is in (closes it on failure).
        return Response(await upstream.read(), upstream.status, headers)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    routes = [Route("/v1/{path:path}", passthrough, methods=methods)]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9100/v1")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        workers=1,
    )


if __name__ == "__main__":
    main()
