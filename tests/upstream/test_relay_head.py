"""A stream whose head was peeked for an overflow (relay.py ``Streamed``): its first bytes
go out before the relay waits on anything (issue 27's time to first byte), the rest and
the end as before, and a client that cannot be sent to frees the upstream answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.upstream.client import UpstreamResponse
from proxy.upstream.relay import relay

HEAD = b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n'
REST = [b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', b"data: [DONE]\n\n"]


class FakeStream:
    """An upstream 200 event stream whose head was read (``started``), as diagnose leaves it."""

    def __init__(self) -> None:
        self.status_code = 200
        self.raw_headers = ((b"content-type", b"text/event-stream"),)
        self.headers = CIMultiDictProxy(CIMultiDict({"content-type": "text/event-stream"}))
        self.closed = 0
        self.started: tuple[bytes, AsyncIterator[bytes]] | None = (HEAD, self._rest())

    async def _rest(self) -> AsyncIterator[bytes]:
        for chunk in REST:
            yield chunk

    async def aclose(self) -> None:
        self.closed += 1


def _scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


@pytest.mark.usefixtures("shortcuts_on")  # Streamed's own way
async def test_the_head_goes_out_before_the_relay_waits_on_the_client() -> None:
    upstream = FakeStream()
    seen: list[bytes] = []
    response = await relay(cast(UpstreamResponse, upstream), watch=seen.append)
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        # Starlette's disconnect listener: by now the head must be out already.
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response(_scope(), receive, send)
    bodies = [m["body"] for m in sent[1:]]
    assert bodies == [HEAD, *REST, b""]
    assert sent[-1]["more_body"] is False
    assert seen == [HEAD, *REST]  # the usage watcher sees every byte, the head once
    assert upstream.closed >= 1


@pytest.mark.usefixtures("shortcuts_on")  # Streamed's own way
async def test_a_client_that_cannot_be_sent_to_frees_the_upstream_answer() -> None:
    upstream = FakeStream()
    response = await relay(cast(UpstreamResponse, upstream))

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client went away")  # what an ASGI 2.4 server raises

    with pytest.raises(OSError, match="went away"):
        await response(_scope(), receive, send)
    assert upstream.closed == 1
