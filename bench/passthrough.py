"""A minimal starlette passthrough per HTTP client: the baseline and the earlier floor.

Since issue 27 the floor the goals count against is ``passthrough_lean.py``, which answers a
non-streamed reply with one ``Response``; this one streams every reply, which costs more.

Forwards any ``/v1/{path}`` request (method, query, body, headers minus hop-by-hop and host) to
``--upstream`` and streams the reply back through a ``StreamingResponse`` whose background task
closes the upstream response. ``--client`` picks the HTTP client on the forwarding path:

- ``httpx``: a plain ``httpx.AsyncClient`` (the baseline the proxy is compared with);
- ``httpx-aiohttp``: the same httpx API over ``httpx_aiohttp.AiohttpTransport``;
- ``aiohttp``: a raw ``aiohttp.ClientSession``.

    python bench/passthrough.py --port 9200 --upstream http://127.0.0.1:9100/v1 --client httpx
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Literal, TypedDict, get_args

import aiohttp
import httpx
import uvicorn
from httpx_aiohttp import AiohttpTransport
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

Client = Literal["httpx", "httpx-aiohttp", "aiohttp"]
Forward = Callable[[Request], Awaitable[Response]]

POOL_SIZE = 1000
_TIMEOUT_S = 600.0
# Hop-by-hop headers (RFC 9110 7.6.1) never cross a proxy.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The client sets host and content-length for the body it sends.
_DROP_REQUEST = _HOP_BY_HOP | {"host", "content-length"}
# Our server adds its own date and server. The upstream's content-length stays: the raw
# bytes are relayed unchanged.
_DROP_REPLY = _HOP_BY_HOP | {"date", "server"}


class State(TypedDict):
    forward: Forward


def _keep(headers: Iterable[tuple[str, str]], drop: frozenset[str]) -> dict[str, str]:
    return {k: v for k, v in headers if k.lower() not in drop}


def _target(base_url: str, request: Request) -> str:
    query = request.url.query
    return f"{base_url}/{request.path_params['path']}" + (f"?{query}" if query else "")


def _httpx_forward(client: httpx.AsyncClient, base_url: str) -> Forward:
    async def forward(request: Request) -> Response:
        outgoing = client.build_request(
            request.method,
            _target(base_url, request),
            headers=_keep(request.headers.items(), _DROP_REQUEST),
            content=await request.body(),
        )
        upstream = await client.send(outgoing, stream=True)
        return StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            headers=_keep(upstream.headers.items(), _DROP_REPLY),
            background=BackgroundTask(upstream.aclose),
        )

    return forward


def _aiohttp_forward(session: aiohttp.ClientSession, base_url: str) -> Forward:
    async def forward(request: Request) -> Response:
        upstream = await session.request(
            request.method,
            _target(base_url, request),
            headers=_keep(request.headers.items(), _DROP_REQUEST),
            data=await request.body(),
        )

        async def release() -> None:
            upstream.release()

        return StreamingResponse(
            upstream.content.iter_any(),
            status_code=upstream.status,
            headers=_keep(upstream.headers.items(), _DROP_REPLY),
            background=BackgroundTask(release),
        )

    return forward


def _connector() -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=POOL_SIZE, limit_per_host=0)


def create_app(client: Client, upstream: str) -> Starlette:
    """A passthrough to ``upstream`` (a base URL such as ``http://host:port/v1``)."""
    base_url = upstream.rstrip("/")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        if client == "aiohttp":
            async with aiohttp.ClientSession(
                connector=_connector(),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=_TIMEOUT_S),
            ) as session:
                yield {"forward": _aiohttp_forward(session, base_url)}
            return
        if client == "httpx-aiohttp":
            session = aiohttp.ClientSession(connector=_connector())
            transport: httpx.AsyncBaseTransport = AiohttpTransport(client=session)
        else:
            limits = httpx.Limits(max_connections=POOL_SIZE, max_keepalive_connections=POOL_SIZE)
            transport = httpx.AsyncHTTPTransport(limits=limits)
        # Closing the client closes the transport, and the aiohttp session with it.
        async with httpx.AsyncClient(transport=transport, timeout=_TIMEOUT_S) as http:
            yield {"forward": _httpx_forward(http, base_url)}

    async def passthrough(request: Request) -> Response:
        forward: Forward = request.state.forward
        return await forward(request)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    routes = [Route("/v1/{path:path}", passthrough, methods=methods)]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9100/v1")
    parser.add_argument("--client", choices=get_args(Client), default="httpx")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.client, args.upstream),
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
