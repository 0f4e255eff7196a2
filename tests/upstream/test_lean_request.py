"""``UpstreamClient._request``: a POST to a plain URL skips ``ClientSession._request``
(shortcuts/aiohttp_request.py). Each case here runs twice, once that way and once with the
shortcuts off (``session.request`` and aiohttp's own request class),
and the two must end the same: the same head and body upstream, the same answer back, or
the same error, translated the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.shortcuts import aiohttp_request as lean_module
from proxy.upstream.client import UpstreamClient
from proxy.upstream.urls import plain_url
from tests.support.breaking_upstream import BreakingUpstream
from tests.support.recording_upstream import RecordingUpstream
from tests.support.servers import free_port, proxy_settings
from tests.support.shortcuts import switch

Call = Callable[[UpstreamClient, str], Awaitable[Any]]


async def _outcome(url: str, call: Call, *, lean: bool, **upstream: Any) -> Any:
    """What ``call`` ended with: its result, or the error's type, text, status and cause."""
    client = UpstreamClient(proxy_settings(url, upstream=upstream))
    try:
        return ("ok", await call(client, url))
    except Exception as exc:
        cause = exc.__cause__
        return (type(exc), str(exc), getattr(exc, "status", None), type(cause))
    finally:
        assert not client._deadlines._due
        await client.aclose()


async def _both(
    monkeypatch: pytest.MonkeyPatch, url: str, call: Call, **upstream: Any
) -> tuple[Any, Any]:
    lean = await _outcome(url, call, lean=True, **upstream)
    switch(monkeypatch, False)
    general = await _outcome(url, call, lean=False, **upstream)
    switch(monkeypatch, True)
    return lean, general


async def _post(client: UpstreamClient, url: str, body: Any = b'{"a":1}') -> tuple[Any, ...]:
    headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer k")]
    response = await client.send("POST", f"{url}/v1/chat/completions", headers, body)
    raw = response.raw_headers
    return response.status_code, [h for h in raw if h[0] != b"date"], await response.aread_closed()


@pytest.mark.usefixtures("shortcuts_on")  # the shortcut's own way
def test_the_pinned_aiohttp_takes_the_lean_path() -> None:
    assert lean_module.on_path(), aiohttp.__version__


@pytest.mark.usefixtures("shortcuts_on")  # the shortcut's own way
async def test_a_post_skips_the_sessions_request(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ClientSession._request")

    async with RecordingUpstream() as upstream:
        monkeypatch.setattr(aiohttp.ClientSession, "_request", refuse)
        client = UpstreamClient(proxy_settings(upstream.url))
        try:
            assert (await _post(client, upstream.url))[2] == b"{}"
            for method in ("GET", "get", "PUT"):  # aiohttp retries these: its own path
                with pytest.raises(AssertionError, match=r"ClientSession\._request"):
                    await client.send(method, f"{upstream.url}/v1/models", [], None)
        finally:
            await client.aclose()


@pytest.mark.parametrize(
    "body",
    [b'{"a":1}', b"x" * (1024 * 1024 + 1), None],
    ids=["bytes", "over a megabyte (BytesIO)", "none"],
)
async def test_the_same_head_body_and_answer(
    monkeypatch: pytest.MonkeyPatch, body: bytes | None
) -> None:
    async with RecordingUpstream() as upstream:
        lean, general = await _both(monkeypatch, upstream.url, lambda c, u: _post(c, u, body))
    assert lean == general
    assert lean[0] == "ok"
    assert len(upstream.heads) == 2
    assert upstream.heads[0] == upstream.heads[1]
    assert upstream.bodies[0] == upstream.bodies[1] == (body or b"")


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-two", b"1"), (b"x-two", b"2"), (b"host", b"elsewhere")],
        [(b"X-Two", b"1"), (b"x-two", b"2"), (b"x-one", b"3"), (b"X-TWO", b"4")],
        [(b"Authorization", b"Bearer a"), (b"authorization", b"Bearer b")],
    ],
    ids=["repeated, one spelling", "repeated, several spellings", "credentials twice"],
)
async def test_the_same_head_for_repeated_header_names(
    monkeypatch: pytest.MonkeyPatch, headers: list[tuple[bytes, bytes]]
) -> None:
    # The lean path hands the caller's list to the request as it is; a name repeated in
    # another spelling takes aiohttp's own merge (``_prepare_headers``), as the session does.
    async def call(client: UpstreamClient, url: str) -> Any:
        response = await client.send("POST", f"{url}/v1/chat/completions", headers, b"{}")
        return await response.aread_closed()

    async with RecordingUpstream() as upstream:
        lean, general = await _both(monkeypatch, upstream.url, call)
    assert lean == general == ("ok", b"{}")
    assert upstream.heads[0] == upstream.heads[1]


async def test_the_same_streamed_request_body(monkeypatch: pytest.MonkeyPatch) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"a":'
        yield b"1}"

    async with RecordingUpstream() as upstream:
        lean, general = await _both(monkeypatch, upstream.url, lambda c, u: _post(c, u, chunks()))
    assert lean == general
    assert upstream.heads[0] == upstream.heads[1]
    assert b"Transfer-Encoding: chunked" in upstream.heads[0]
    assert upstream.bodies == [b'{"a":1}', b'{"a":1}']


async def test_the_same_error_for_a_reset_before_the_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with BreakingUpstream(b"", b"") as upstream:
        upstream.cut.set()
        lean, general = await _both(monkeypatch, upstream.url, _post)
    assert lean == general
    assert lean[2] == 502


async def test_the_same_error_for_a_refused_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    lean, general = await _both(monkeypatch, url, _post)
    assert lean == general
    assert (lean[2], lean[3]) == (502, aiohttp.ClientConnectorError)


@pytest.mark.parametrize(
    "timeouts", [{"total_timeout_s": 0.2}, {"timeout_s": 0.2}], ids=["total", "sock_read"]
)
async def test_the_same_timeout_before_the_head(
    monkeypatch: pytest.MonkeyPatch, timeouts: dict[str, float]
) -> None:
    async with BreakingUpstream(b"", b"") as upstream:
        lean, general = await _both(monkeypatch, upstream.url, _post, **timeouts)
    assert lean == general
    assert lean[2] == 504


@pytest.mark.parametrize(
    "head", [b"HTTP/1.1 101 Switching Protocols\r\n\r\n", b"HTTP/1.1 600 No\r\n\r\n"]
)
async def test_the_same_error_for_an_invalid_status(
    monkeypatch: pytest.MonkeyPatch, head: bytes
) -> None:
    async with BreakingUpstream(head, b"") as upstream:
        lean, general = await _both(monkeypatch, upstream.url, _post)
    assert lean == general
    assert lean[2] == 502


async def test_the_same_error_for_a_header_aiohttp_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def bad_header(client: UpstreamClient, url: str) -> object:
        return await client.send("POST", f"{url}/v1/x", [(b"x-a", b"a\r\nb")], b"{}")

    async with BreakingUpstream(b"", b"") as upstream:
        lean, general = await _both(monkeypatch, upstream.url, bad_header)
    assert lean == general
    assert lean[0] is ValueError


async def test_the_same_answer_after_a_pooled_connection_was_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upstream resets a kept-alive connection while it is idle: the next POST goes
    out on a new one either way."""
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"

    async def twice(client: UpstreamClient, url: str) -> object:
        first = await _post(client, url)
        upstream.cut.set()  # the upstream resets the connection the first answer came on
        await asyncio.sleep(0.1)
        return first, await _post(client, url)

    async with BreakingUpstream(head, b"{}") as upstream:
        lean = await _outcome(upstream.url, twice, lean=True)
        upstream.cut.clear()
        switch(monkeypatch, False)
        general = await _outcome(upstream.url, twice, lean=False)
    assert lean == general
    assert lean[0] == "ok"


@pytest.mark.parametrize(
    ("error", "status", "cause"),
    [
        (ConnectionResetError(104, "reset"), 502, aiohttp.ClientOSError),
        (OSError(110, "timed out"), 502, aiohttp.ClientOSError),  # a TimeoutError, errno set
        (TimeoutError(), 504, TimeoutError),
        (aiohttp.ServerDisconnectedError(), 502, aiohttp.ServerDisconnectedError),
    ],
    ids=["reset", "ETIMEDOUT", "timeout", "aiohttp's"],
)
async def test_the_same_wrapping_of_an_error_sending(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, status: int, cause: type
) -> None:
    """What the request's send raises: aiohttp wraps an OSError (but a plain timeout and
    its own errors) in ClientOSError; the lean path does the same."""

    async def fail(self: Any, conn: Any) -> None:
        raise error

    monkeypatch.setattr(aiohttp.ClientRequest, "send", fail)  # LeanRequest's too
    async with RecordingUpstream() as upstream:
        lean, general = await _both(monkeypatch, upstream.url, _post)
    assert lean == general
    assert (lean[2], lean[3]) == (status, cause)


@pytest.mark.parametrize(
    ("url", "plain"),
    [
        ("http://127.0.0.1:9/v1/chat/completions", True),
        ("https://[::1]:8443/v1/x?a=1", True),
        (URL("http://h/v1/a%2Fb", encoded=True), True),
        ("http://user:pass@h/v1/x", False),  # aiohttp makes these an Authorization header
        ("http://user@h/v1/x", False),
        ("ftp://h/v1/x", False),
        ("http:///v1/x", False),
    ],
)
def test_which_urls_take_the_lean_path(url: str | URL, plain: bool) -> None:
    found = plain_url(url)
    assert (found is not None) == plain
    if found is not None:
        assert found == URL(url)
        assert found.raw_path_qs == URL(url).raw_path_qs


async def test_credentials_in_the_url_go_as_aiohttps_authorization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def post(client: UpstreamClient, url: str) -> object:
        authority = url.removeprefix("http://")
        response = await client.send("POST", f"http://u:p@{authority}/v1/x", [], b"{}")
        return await response.aread_closed()

    async with RecordingUpstream() as upstream:
        lean, general = await _both(monkeypatch, upstream.url, post)
    assert lean == general == ("ok", b"{}")
    assert upstream.heads[0] == upstream.heads[1]
    assert b"Authorization: Basic dTpw\r\n" in upstream.heads[0]
