"""The request head ``UpstreamClient.send`` writes, byte for byte: the caller's headers in
their order, aiohttp's Host first, its ``Accept: */*`` only when the caller sent none, the
body's Content-Length last, and none of the headers aiohttp would add of its own
(User-Agent, Accept-Encoding, a Content-Type for the bytes). The session builds its requests
with a class of its own (shortcuts/aiohttp_request.py, ``LeanRequest``); these hold it to
aiohttp's output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proxy.upstream.client import UpstreamClient
from tests.support.recording_upstream import RecordingUpstream
from tests.support.servers import proxy_settings


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[RecordingUpstream, str]]:
    async with RecordingUpstream() as upstream:
        yield upstream, upstream.url


async def _send(
    url: str, method: str, headers: list[tuple[bytes, bytes]], body: bytes | None
) -> bytes:
    client = UpstreamClient(proxy_settings(url))
    try:
        response = await client.send(method, f"{url}/v1/chat/completions", headers, body)
        answer = await response.aread_at_most(1 << 20)
        await response.aclose()
        return answer
    finally:
        await client.aclose()


async def test_a_post_carries_the_callers_headers_then_accept_then_its_length(
    recorded: tuple[RecordingUpstream, str],
) -> None:
    recorder, url = recorded
    headers = [
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer sk-test"),
        (b"x-two", b"1"),
        (b"x-two", b"2"),
    ]
    assert await _send(url, "POST", headers, b'{"a":1}') == b"{}"
    host = url.removeprefix("http://").encode()
    assert recorder.heads == [
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"Host: " + host + b"\r\n"
        b"content-type: application/json\r\n"
        b"authorization: Bearer sk-test\r\n"
        b"x-two: 1\r\n"
        b"x-two: 2\r\n"
        b"Accept: */*\r\n"
        b"Content-Length: 7\r\n\r\n"
    ]
    assert recorder.bodies == [b'{"a":1}']


async def test_the_callers_accept_and_user_agent_go_as_they_are(
    recorded: tuple[RecordingUpstream, str],
) -> None:
    recorder, url = recorded
    headers = [(b"accept", b"text/plain"), (b"user-agent", b"me/1"), (b"accept-encoding", b"br")]
    await _send(url, "POST", headers, b"{}")
    host = url.removeprefix("http://").encode()
    assert recorder.heads == [
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"Host: " + host + b"\r\n"
        b"accept: text/plain\r\n"
        b"user-agent: me/1\r\n"
        b"accept-encoding: br\r\n"
        b"Content-Length: 2\r\n\r\n"
    ]


@pytest.mark.parametrize(
    ("method", "tail"),
    [("GET", b"Accept: */*\r\n\r\n"), ("POST", b"Accept: */*\r\nContent-Length: 0\r\n\r\n")],
)
async def test_a_call_without_a_body_gets_no_content_type(
    recorded: tuple[RecordingUpstream, str], method: str, tail: bytes
) -> None:
    recorder, url = recorded
    await _send(url, method, [], None)
    host = url.removeprefix("http://").encode()
    start = f"{method} /v1/chat/completions HTTP/1.1\r\nHost: ".encode()
    assert recorder.heads == [start + host + b"\r\n" + tail]
