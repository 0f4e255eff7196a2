"""The upstream client: its errors, and a stream the upstream breaks off mid-body.

The upstream here is a raw asyncio server on a real socket that answers with
headers and a few SSE chunks and then resets the connection: nothing an ASGI
app can be made to do.
Through a real proxy: tests/e2e/test_upstream_client_e2e.py.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from proxy.errors import UpstreamStreamBroken, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.client import UpstreamClient, UpstreamResponse
from tests.support.breaking_upstream import CHUNKS, SSE_HEAD, BreakingUpstream, _chunked
from tests.support.servers import proxy_settings


async def read_until_broken(
    response: UpstreamResponse, received: list[bytes], cut: asyncio.Event
) -> None:
    """Read the body into ``received``; once all of CHUNKS came, have the upstream cut."""
    async for chunk in response.aiter_raw():
        received.append(chunk)
        if b"".join(received) == b"".join(CHUNKS):
            cut.set()


async def test_client_body_broken_after_the_headers_is_stream_broken() -> None:
    sse = b"".join(_chunked(c) for c in CHUNKS)
    async with BreakingUpstream(SSE_HEAD, sse) as upstream:
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            response = await client.send("GET", f"{upstream.url}/v1/events", [], None)
            received: list[bytes] = []
            with pytest.raises(UpstreamStreamBroken) as broken:
                await read_until_broken(response, received, upstream.cut)
            await response.aclose()
        finally:
            await client.aclose()
    assert b"".join(received) == b"".join(CHUNKS)
    assert broken.value.__cause__ is not None
    assert (broken.value.status, broken.value.code) == (502, "upstream_unavailable")


async def test_client_small_body_broken_midway_is_stream_broken() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    async with BreakingUpstream(head, b'{"partial": ') as upstream:
        upstream.cut.set()
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            response = await client.send("GET", f"{upstream.url}/v1/models", [], None)
            with pytest.raises(UpstreamStreamBroken):
                await response.aread_at_most(1024)
            await response.aclose()
        finally:
            await client.aclose()


async def test_client_body_that_outlives_the_total_timeout_is_a_timed_out_stream() -> None:
    async with BreakingUpstream(SSE_HEAD, _chunked(CHUNKS[0])) as upstream:
        settings = proxy_settings(upstream.url, upstream={"total_timeout_s": 0.5})
        client = UpstreamClient(settings)
        try:
            response = await client.send("GET", f"{upstream.url}/v1/events", [], None)
            with pytest.raises(UpstreamStreamBroken) as broken:
                await read_until_broken(response, [], upstream.cut)
            await response.aclose()
        finally:
            await client.aclose()
    assert isinstance(broken.value.__cause__, TimeoutError)
    assert (broken.value.status, broken.value.code) == (504, "upstream_timeout")


async def test_client_connection_reset_before_the_headers_is_unavailable() -> None:
    async with BreakingUpstream(b"", b"") as upstream:
        upstream.cut.set()
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            with pytest.raises(UpstreamUnavailable) as unavailable:
                await client.send("GET", f"{upstream.url}/v1/models", [], None)
        finally:
            await client.aclose()
    assert not isinstance(unavailable.value, UpstreamStreamBroken)


async def test_client_no_headers_within_the_total_timeout_is_a_timeout() -> None:
    async with BreakingUpstream(b"", b"") as upstream:
        client = UpstreamClient(proxy_settings(upstream.url, upstream={"total_timeout_s": 0.3}))
        try:
            with pytest.raises(UpstreamTimeout):
                await client.send("GET", f"{upstream.url}/v1/models", [], None)
        finally:
            await client.aclose()


def test_only_the_upstream_module_imports_aiohttp() -> None:
    """upstream/client.py is the one place that knows the HTTP client (with its shortcut,
    shortcuts/aiohttp_request.py)."""
    package = Path(__file__).resolve().parents[2] / "proxy"
    importers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n == "aiohttp" or n.startswith("aiohttp.") for n in names):
                importers.append(path.relative_to(package).as_posix())
    assert set(importers) == {"upstream/client.py", "shortcuts/aiohttp_request.py"}


# upstream.total_timeout_s is kept by Deadlines (proxy/upstream/deadline.py), not aiohttp.


async def test_a_timeout_before_the_head_leaves_the_task_uncancelled() -> None:
    """The deadline cancels the task waiting for the head; send turns that into
    UpstreamTimeout and takes the cancellation back: nothing leaks to the next await."""
    async with BreakingUpstream(b"", b"") as upstream:
        client = UpstreamClient(proxy_settings(upstream.url, upstream={"total_timeout_s": 0.2}))
        try:
            with pytest.raises(UpstreamTimeout):
                await client.send("GET", f"{upstream.url}/v1/models", [], None)
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0
            await asyncio.sleep(0.01)  # no CancelledError left pending
            assert not client._deadlines._due
        finally:
            await client.aclose()


async def test_a_send_cancelled_by_anything_else_stays_cancelled() -> None:
    async with BreakingUpstream(b"", b"") as upstream:
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            sending = asyncio.create_task(client.send("GET", f"{upstream.url}/v1/models", [], None))
            await asyncio.sleep(0.1)
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            assert not client._deadlines._due
        finally:
            await client.aclose()


async def test_an_answer_read_and_closed_drops_its_deadline() -> None:
    """Deadlines holds a call until its response is closed, then nothing: no entry and,
    once a tick has passed, no timer."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
    async with BreakingUpstream(head, b"{}") as upstream:
        client = UpstreamClient(proxy_settings(upstream.url, upstream={"total_timeout_s": 0.4}))
        try:
            response = await client.send("GET", f"{upstream.url}/v1/models", [], None)
            assert len(client._deadlines._due) == 1
            assert await response.aread_at_most(1024) == b"{}"
            await response.aclose()
            assert not client._deadlines._due
            await asyncio.sleep(0.15)  # past a tick (0.4 / 8 s): the timer stopped
            assert client._deadlines._timer is None
        finally:
            await client.aclose()


async def test_a_send_that_fails_otherwise_drops_its_deadline() -> None:
    """A call that ends in an error aiohttp raises as no ClientError (a header it refuses)
    leaves no deadline that could cancel its task later."""
    async with BreakingUpstream(b"", b"") as upstream:
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            with pytest.raises(ValueError, match="control character"):
                await client.send("GET", f"{upstream.url}/v1/models", [(b"x-a", b"a\r\nb")], None)
            assert not client._deadlines._due
        finally:
            await client.aclose()
