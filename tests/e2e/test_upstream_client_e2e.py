"""The upstream client end to end: a stream the upstream resets midway ends cleanly
through a real proxy, with one warning. The client itself: tests/upstream/test_upstream_client.py.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.support.breaking_upstream import _WAIT_S, CHUNKS, SSE_HEAD, BreakingUpstream, _chunked
from tests.support.logs import all_logs, assert_one_break_warning
from tests.support.servers import proxy_settings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/v1/events", None), ("POST", "/v1/chat/completions", CHAT)],
    ids=["passthrough", "chat"],
)
async def test_a_stream_the_upstream_resets_midway_ends_cleanly_with_one_warning(
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: dict[str, object] | None,
) -> None:
    """The client keeps the chunks that came and sees a well-formed end of the body."""
    sse = b"".join(_chunked(c) for c in CHUNKS)
    async with BreakingUpstream(SSE_HEAD, sse) as upstream:
        proxy = start_proxy(proxy_settings(upstream.url))
        received = b""
        with all_logs(caplog):
            async with (
                httpx.AsyncClient(timeout=_WAIT_S) as client,
                client.stream(method, f"{proxy}{path}", json=body) as r,
            ):
                assert r.status_code == 200
                async for chunk in r.aiter_raw():
                    received += chunk
                    if received == b"".join(CHUNKS):
                        upstream.cut.set()  # everything relayed: now break the upstream
    assert upstream.requests == 1
    assert received == b"".join(CHUNKS)
    assert_one_break_warning(caplog, "ClientPayloadError")
