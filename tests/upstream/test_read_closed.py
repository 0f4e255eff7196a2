"""``UpstreamResponse.aread_closed``: a small answer read whole and closed in one step (how
``relay`` reads a non-streamed answer). Its connection goes back to the pool, its deadline
ends, and a body that breaks, times out or is given up on closes the connection instead,
as reading and then ``aclose`` would.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.errors import UpstreamStreamBroken
from proxy.upstream.client import UpstreamClient
from tests.support.breaking_upstream import BreakingUpstream
from tests.support.recording_upstream import RecordingUpstream
from tests.support.servers import proxy_settings

_PARTIAL = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"


async def test_a_body_read_whole_frees_its_connection_for_the_next_call() -> None:
    async with RecordingUpstream() as upstream:
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            for _ in range(3):
                response = await client.send("POST", f"{upstream.url}/v1/x", [], b"{}")
                assert await response.aread_closed() == b"{}"
                assert not client._deadlines._due
        finally:
            await client.aclose()
    assert (upstream.connections, len(upstream.heads)) == (1, 3)


async def test_a_body_broken_midway_is_stream_broken_and_closed() -> None:
    async with BreakingUpstream(_PARTIAL, b'{"partial": ') as upstream:
        upstream.cut.set()
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            response = await client.send("GET", f"{upstream.url}/v1/models", [], None)
            with pytest.raises(UpstreamStreamBroken) as broken:
                await response.aread_closed()
            assert response._response.closed
            assert not client._deadlines._due
        finally:
            await client.aclose()
    assert broken.value.__cause__ is not None
    assert (broken.value.status, broken.value.code) == (502, "upstream_unavailable")


async def test_a_body_past_the_total_timeout_is_a_timed_out_stream() -> None:
    async with BreakingUpstream(_PARTIAL, b'{"partial": ') as upstream:
        client = UpstreamClient(proxy_settings(upstream.url, upstream={"total_timeout_s": 0.3}))
        try:
            response = await client.send("GET", f"{upstream.url}/v1/models", [], None)
            with pytest.raises(UpstreamStreamBroken) as broken:
                await response.aread_closed()
            assert not client._deadlines._due
        finally:
            await client.aclose()
    assert isinstance(broken.value.__cause__, TimeoutError)
    assert (broken.value.status, broken.value.code) == (504, "upstream_timeout")


async def test_a_read_given_up_on_closes_the_connection() -> None:
    """A client gone while the body is read (its task cancelled): the connection is closed,
    not put back in the pool half read, and the deadline ends."""
    async with BreakingUpstream(_PARTIAL, b'{"partial": ') as upstream:
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            response = await client.send("GET", f"{upstream.url}/v1/models", [], None)
            reading = asyncio.create_task(response.aread_closed())
            await asyncio.sleep(0.05)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            assert response._response.closed
            assert response._response.connection is None
            assert not client._deadlines._due
        finally:
            await client.aclose()
