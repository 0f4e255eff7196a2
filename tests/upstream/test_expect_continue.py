"""A client's ``Expect: 100-continue`` stops at the proxy. Its server has already answered
it (uvicorn sends the 100 when the app first reads the body) and the proxy sends a body it
holds; forwarded, it made aiohttp withhold that body until the upstream sent a 100 of its
own, with no read timeout running meanwhile: an upstream that reads the body without a 100
(RFC 9110 10.1.1 allows it) held the call until the total deadline (30 min by default).
curl sends the expectation with every body over 1 MB.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.upstream.headers import HeaderPolicy
from tests.support.recording_upstream import RecordingUpstream
from tests.support.servers import proxy_settings, run_proxy


def test_the_expectation_is_not_forwarded() -> None:
    policy = HeaderPolicy(proxy_settings("http://127.0.0.1:9"))
    sent = [(b"content-type", b"application/json"), (b"Expect", b"100-continue")]
    for inspect in (False, True):
        assert b"expect" not in {k.lower() for k, _ in policy.outgoing(sent, inspect=inspect)}


@pytest.mark.e2e
async def test_a_client_expecting_100_continue_gets_its_answer() -> None:
    async with RecordingUpstream() as upstream:
        settings = proxy_settings(upstream.url, upstream={"timeout_s": 2.0})
        with run_proxy(settings) as url:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":")[-1]))
            body = b'{"model": "m", "input": "hi"}'
            writer.write(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: proxy\r\n"
                b"Content-Type: application/json\r\nAuthorization: Bearer k\r\n"
                b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            try:
                interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
                writer.write(body)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            finally:
                writer.close()
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert upstream.bodies == [body]
    assert b"expect" not in upstream.heads[0].lower()
