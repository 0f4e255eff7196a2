"""The upstream request without the parts of aiohttp's the proxy's session never uses.

``lean_request`` is aiohttp 3.14's ``ClientSession._request`` for a POST to a plain URL
(what the proxy sends), less redirects, cookies, traces, middlewares and a total timeout:
the same request, head and errors. ``LeanRequest`` is aiohttp's ``ClientRequest`` with its
automatic headers and a body of bytes decided for the session's skip set (``SKIP_SET``),
``Bytes`` aiohttp's payload of bytes as its registry makes it. All three set or read
aiohttp 3.14's private attributes: ``on_path()`` says whether they run (that series, the
shortcuts not switched off); otherwise ``upstream/client.py`` uses ``session.request`` and
aiohttp's own ``ClientRequest``. tests/upstream/test_request_head.py and
test_lean_request.py hold both ways to the same bytes and errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import aiohttp
from aiohttp import BytesPayload, hdrs
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from proxy.shortcuts.gate import missing, on

try:  # what only the shortcuts use: another release may have moved it (then they are off)
    from aiohttp.helpers import TimerNoop
    from aiohttp.http import SERVER_SOFTWARE
    from aiohttp.payload import TOO_LARGE_BYTES_BODY

    _NO_TIMER = TimerNoop()
except ImportError as exc:
    missing("aiohttp", exc)

# aiohttp adds these when absent; the proxy sends what the client sent, no more.
SKIP_SET = frozenset(istr(name) for name in ("User-Agent", "Accept-Encoding", "Content-Type"))
_SKIP: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(SKIP_SET))
_OCTETS = {hdrs.CONTENT_TYPE: "application/octet-stream"}  # a BytesPayload's one header


def on_path() -> bool:
    """Whether ``LeanRequest`` and ``lean_request`` serve (aiohttp 3.14, shortcuts on)."""
    return on("aiohttp")


class Bytes(BytesPayload):
    """aiohttp's payload of bytes, as its registry makes it, without its general work."""

    _headers = cast("CIMultiDict[str]", CIMultiDictProxy(CIMultiDict(_OCTETS)))
    _encoding = None
    _filename = None

    def __init__(self, value: bytes) -> None:
        self._value = value
        self._size = len(value)


class LeanRequest(aiohttp.ClientRequest):
    """aiohttp's request, its automatic headers and a body of bytes decided for the
    session's skip set. The same head: tests/upstream/test_request_head.py."""

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        if skip_auto_headers != SKIP_SET:  # not the session's: aiohttp's own way
            super().update_auto_headers(skip_auto_headers)
            return
        self._skip_auto_headers = _SKIP
        for name, value in _AUTO:
            if name not in self.headers:
                self.headers[name] = value

    def update_body_from_data(self, body: Any, _stacklevel: int = 3) -> None:
        if (
            type(body) is not bytes
            or self._body is not None
            or self._skip_auto_headers is not _SKIP
            or len(body) > TOO_LARGE_BYTES_BODY
        ):
            super().update_body_from_data(body, _stacklevel + 1)
            return
        # As the registry's BytesPayload: its one header, Content-Type, is in the skip set.
        self._body = Bytes(body)
        if not self.chunked and hdrs.CONTENT_LENGTH not in self.headers:
            self.headers[hdrs.CONTENT_LENGTH] = str(len(body))


# What aiohttp adds when the caller sent none and the session does not skip, in its order.
try:
    _AUTO = [*LeanRequest.DEFAULT_HEADERS.items(), (hdrs.USER_AGENT, SERVER_SOFTWARE)]
    _AUTO = [(name, value) for name, value in _AUTO if name not in _SKIP]
except (AttributeError, NameError) as exc:
    missing("aiohttp", exc)


def _timeout(exc: OSError) -> bool:
    return exc.errno is None and isinstance(exc, TimeoutError)  # not ETIMEDOUT's OSError


async def lean_request(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: list[tuple[str, str]],
    data: object,
) -> aiohttp.ClientResponse:
    """``session.request(method, url, ...)`` for a plain ``url``, the session built with
    ``LeanRequest`` and ``SKIP_SET`` and no total timeout, as ``ClientSession._request``
    would make and send it."""
    timeout, connector = session.timeout, session.connector
    assert connector is not None
    # Names each once, in any spelling, and no session defaults: the list is what
    # ``_prepare_headers`` would make of it (~2 µs); else aiohttp's merge.
    distinct = len({name.lower() for name, _ in headers}) == len(headers)
    req = LeanRequest(
        method,
        url,
        headers=headers
        if distinct and not session._default_headers
        else session._prepare_headers(headers),
        skip_auto_headers=session.skip_auto_headers,
        data=data,
        version=session._version,
        loop=session._loop,
        response_class=session._response_class,
        timer=_NO_TIMER,
        session=session,
    )
    try:
        try:
            conn = await connector.connect(req, traces=[], timeout=timeout)
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url}") from exc
        assert conn.protocol is not None
        conn.protocol.set_response_params(
            timer=_NO_TIMER,
            read_until_eof=True,
            auto_decompress=session.auto_decompress,
            read_timeout=timeout.sock_read,
            read_bufsize=session._read_bufsize,
            timeout_ceil_threshold=connector._timeout_ceil_threshold,
            max_line_size=session._max_line_size,
            max_field_size=session._max_field_size,
            max_headers=session._max_headers,
        )
        try:
            response = await req.send(conn)
            try:
                await response.start(conn)
            except BaseException:
                response.close()
                raise
        except BaseException:
            conn.close()
            raise
    except OSError as exc:
        if isinstance(exc, aiohttp.ClientError) or _timeout(exc):
            raise
        raise aiohttp.ClientOSError(*exc.args) from exc  # as aiohttp's own path does
    finally:
        if req._body is not None and type(req._body) is not Bytes:  # (its close: a no-op)
            await req._body.close()
    return response
