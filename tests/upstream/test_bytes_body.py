"""A body of bytes becomes aiohttp's payload without aiohttp's payload registry
(shortcuts/aiohttp_request.py, ``LeanRequest.update_body_from_data``). Each case runs four
ways: that or aiohttp's own, with the shortcuts on (the lean path) or off (aiohttp's own
request class and ``session.request``); all must put the same head and body upstream and
get the same answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import payload
from yarl import URL

from proxy.shortcuts import aiohttp_request as lean_module
from proxy.upstream.client import UpstreamClient
from tests.support.recording_upstream import RecordingUpstream
from tests.support.servers import proxy_settings
from tests.support.shortcuts import switch

SMALL = b'{"messages":[{"role":"user","content":"hi"}]}'


async def _post(url: str, body: bytes | None, extra: list[tuple[bytes, bytes]]) -> Any:
    client = UpstreamClient(proxy_settings(url))
    headers = [(b"content-type", b"application/json"), *extra]
    try:
        response = await client.send("POST", f"{url}/v1/chat/completions", headers, body)
        return response.status_code, await response.aread_closed()
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("body", "extra", "sent"),
    [
        (SMALL, [], SMALL),
        (SMALL, [(b"content-length", b"5")], SMALL[:5]),  # aiohttp sends what is declared
        (b"", [], b""),
        (b"x" * (1024 * 1024), [], b"x" * (1024 * 1024)),  # the most sent as bytes
        (None, [], b""),
    ],
    ids=["small", "a shorter content-length", "empty", "a megabyte", "none"],
)
async def test_the_same_head_and_body_upstream_four_ways(
    monkeypatch: pytest.MonkeyPatch,
    body: bytes | None,
    extra: list[tuple[bytes, bytes]],
    sent: bytes,
) -> None:
    ours = lean_module.LeanRequest.update_body_from_data
    answers = []
    async with RecordingUpstream() as upstream:
        for way in (ours, aiohttp.ClientRequest.update_body_from_data):
            monkeypatch.setattr(lean_module.LeanRequest, "update_body_from_data", way)
            for on in (True, False):
                switch(monkeypatch, on)
                answers.append(await _post(upstream.url, body, extra))
    assert answers == [(200, b"{}")] * 4
    assert len(upstream.heads) == 4
    assert len(set(upstream.heads)) == 1
    assert upstream.bodies == [sent] * 4


async def test_a_body_of_bytes_skips_the_payload_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same headers and payload (value, size, headers, writing) as the registry's."""

    class Refusing:
        def get(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("PAYLOAD_REGISTRY.get")

    loop = asyncio.get_running_loop()
    url = URL("http://127.0.0.1:9/v1/chat/completions")
    common: dict[str, Any] = {"loop": loop, "skip_auto_headers": lean_module.SKIP_SET}
    for headers in ([("content-type", "application/json")], [("Content-Length", "3")]):
        theirs = aiohttp.ClientRequest("POST", url, headers=headers, data=SMALL, **common)
        with monkeypatch.context() as patch:
            patch.setattr(payload, "PAYLOAD_REGISTRY", Refusing())
            ours = lean_module.LeanRequest("POST", url, headers=headers, data=SMALL, **common)
        assert list(ours.headers.items()) == list(theirs.headers.items())
        mine, aiohttps = ours.body, theirs.body
        assert isinstance(mine, payload.BytesPayload)
        assert isinstance(aiohttps, payload.BytesPayload)
        assert (mine.size, mine._value, mine.consumed) == (len(SMALL), SMALL, False)
        assert (mine.size, mine._value) == (aiohttps.size, aiohttps._value)
        assert dict(mine.headers) == dict(aiohttps.headers)
        assert (mine.filename, mine.encoding) == (aiohttps.filename, aiohttps.encoding)
        assert mine.autoclose == aiohttps.autoclose is True
        assert ours.chunked is theirs.chunked is None
