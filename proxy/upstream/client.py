"""The one upstream HTTP client, the one place that knows it: an aiohttp session, chosen
with numbers (bench/README.md, "Figures behind the code"). All else sees ``UpstreamClient``,
``UpstreamResponse`` and the proxy's errors, never aiohttp's. Which headers go
(``headers.py``), where (``urls.py``) and how an answer goes back (``relay.py``) are
decided around it."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

import aiohttp
from aiohttp import hdrs
from aiohttp.client import IDEMPOTENT_METHODS
from aiohttp.helpers import TimerNoop, get_env_proxy_for_url
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.payload import TOO_LARGE_BYTES_BODY, BytesPayload
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from proxy.config import Settings
from proxy.errors import UpstreamUnavailable
from proxy.errors import upstream_failure as _translated
from proxy.upstream.deadline import Deadlines
from proxy.upstream.response import UpstreamResponse as UpstreamResponse
from proxy.upstream.seam import Upstream as Upstream  # the seam's home was here
from proxy.upstream.urls import plain_url

# What the client raises: aiohttp's tree, and timeouts (sock_read, sock_connect; deadline.py)
_CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# Request bodies bigger than this are written in chunks (aiohttp warns about larger bytes).
_WRITE_IN_CHUNKS = 1024 * 1024
# aiohttp adds these when absent; the proxy sends what the client sent, no more.
_SKIP_SET = frozenset(istr(name) for name in ("User-Agent", "Accept-Encoding", "Content-Type"))
_SKIP: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(_SKIP_SET))
_OCTETS = {hdrs.CONTENT_TYPE: "application/octet-stream"}  # a BytesPayload's one header


class _Bytes(BytesPayload):
    """aiohttp's payload of bytes, as its registry makes it, without its general work."""

    _headers = cast("CIMultiDict[str]", CIMultiDictProxy(CIMultiDict(_OCTETS)))
    _encoding = None
    _filename = None

    def __init__(self, value: bytes) -> None:
        self._value = value
        self._size = len(value)


class _Request(aiohttp.ClientRequest):
    """aiohttp's request, its automatic headers and a body of bytes decided for the
    session's skip set (bench/README.md, "Saturation, session of 2026-11-26: the upstream
    call" and its "second pass"). The same head: tests/upstream/test_request_head.py."""

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        if skip_auto_headers != _SKIP_SET:  # not the session's: aiohttp's own way
            super().update_auto_headers(skip_auto_headers)
            return
        self._skip_auto_headers = _SKIP
        for name, value in _AUTO:
            if name not in self.headers:
                self.headers[name] = value

    def update_body_from_data(self, body: Any, _stacklevel: int = 3) -> None:
        if (
            not _LEAN  # _Bytes sets the attributes of aiohttp 3.14's payload
            or type(body) is not bytes
            or self._body is not None
            or self._skip_auto_headers is not _SKIP
            or len(body) > TOO_LARGE_BYTES_BODY
        ):
            super().update_body_from_data(body, _stacklevel + 1)
            return
        # As the registry's BytesPayload: its one header, Content-Type, is in the skip set.
        self._body = _Bytes(body)
        if not self.chunked and hdrs.CONTENT_LENGTH not in self.headers:
            self.headers[hdrs.CONTENT_LENGTH] = str(len(body))


# What aiohttp adds when the caller sent none and the session does not skip, in its order.
_AUTO = [*_Request.DEFAULT_HEADERS.items(), (hdrs.USER_AGENT, SERVER_SOFTWARE)]
_AUTO = [(name, value) for name, value in _AUTO if name not in _SKIP]


# UpstreamClient._request follows aiohttp 3.14's ClientSession._request (constraints.txt).
_LEAN = aiohttp.__version__.startswith("3.14.")
_NO_TIMER = TimerNoop()


def _timeout(exc: OSError) -> bool:
    return exc.errno is None and isinstance(exc, TimeoutError)  # not ETIMEDOUT's OSError


class UpstreamClient:
    """The one upstream HTTP client: an aiohttp session with the timeouts and limits from
    settings; the app's lifespan builds it (inside the running loop) and ``aclose``s it."""

    __slots__ = ("_deadlines", "_lean", "_session")

    def __init__(self, settings: Settings) -> None:
        up = settings.upstream
        connector = aiohttp.TCPConnector(
            limit=up.max_connections, keepalive_timeout=up.keepalive_timeout_s
        )
        # The total runs from send until the response is closed, so it also bounds reading
        # a streamed body, not just the wait for headers: Deadlines (deadline.py), not
        # aiohttp's total, which arms a timer per request.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=up.connect_timeout_s, sock_read=up.timeout_s
        )
        self._deadlines = Deadlines(up.total_timeout_s)
        # HTTP(S)_PROXY / NO_PROXY are read once here. aiohttp's trust_env would
        # read them (and ~/.netrc) in a worker thread on every request.
        try:
            proxy, proxy_auth = get_env_proxy_for_url(URL(up.base_url))
        except LookupError:
            proxy, proxy_auth = None, None
        self._lean = _LEAN and proxy is None
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,  # bytes are relayed exactly as the upstream sent them
            skip_auto_headers=_SKIP_SET,
            # One session serves every tenant: an upstream's cookies must never be
            # stored and replayed on someone else's requests.
            cookie_jar=aiohttp.DummyCookieJar(),
            proxy=proxy,
            proxy_auth=proxy_auth,
            request_class=_Request,
        )

    async def send(
        self,
        method: str,
        url: str | URL,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        """Send and return the response with its body unread; the caller must ``aclose``
        it. Raises ``UpstreamUnavailable`` or ``UpstreamTimeout`` if no answer came."""
        data: bytes | io.BytesIO | AsyncIterator[bytes] | None = content
        if isinstance(content, bytes) and len(content) > _WRITE_IN_CHUNKS:
            # aiohttp writes a BytesIO in chunks, yielding to the loop between them.
            data = io.BytesIO(content)
        deadline = self._deadlines.start()
        try:
            response = await self._request(
                method, url, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers], data
            )
        except BaseException as exc:
            self._deadlines.end(deadline)  # whatever ended the call: nothing cancels later
            if isinstance(exc, asyncio.CancelledError):
                # Cancelled by its deadline alone (not also by anything else): a timeout.
                if not deadline.expired or deadline.task is None or deadline.task.uncancel():
                    raise
                raise _translated(TimeoutError(), body=False) from None
            if isinstance(exc, _CLIENT_ERRORS):
                raise _translated(exc, body=False) from exc
            raise
        deadline.response = response  # from now on the deadline closes it
        if not 200 <= response.status <= 599:
            # A 101 (aiohttp returns it as final) or 600-999 (RFC 9110 defines 100-599):
            # no answer a client could be given; the ASGI server fails on the status line.
            self._deadlines.end(deadline)
            response.close()
            raise UpstreamUnavailable("The upstream answered with an invalid HTTP status.")
        return _Response(response, deadline, self._deadlines)

    async def _request(
        self, method: str, url: str | URL, headers: list[tuple[str, str]], data: object
    ) -> aiohttp.ClientResponse:
        """``session.request``. A POST to a plain URL (the proxy's own calls) skips what of
        ``ClientSession._request`` this session never uses (redirects, cookies, traces,
        middlewares, a total timeout): the same request, head and errors, ~11 µs less."""
        session = self._session
        # (aiohttp retries an idempotent call once on a stale connection: not here)
        plain = plain_url(url) if self._lean and method.upper() not in IDEMPOTENT_METHODS else None
        if plain is None or session.closed:
            return await session.request(
                method, url, headers=headers, data=data, allow_redirects=False
            )
        url = plain
        timeout, connector = session.timeout, session.connector
        assert connector is not None
        # Names each once, in any spelling, and no session defaults: the list is what
        # ``_prepare_headers`` would make of it (~2 µs); else aiohttp's merge.
        distinct = len({name.lower() for name, _ in headers}) == len(headers)
        req = _Request(
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
            if req._body is not None and type(req._body) is not _Bytes:  # (its close: a no-op)
                await req._body.close()
        return response

    async def aclose(self) -> None:
        self._deadlines.close()
        await self._session.close()


class _Response(UpstreamResponse):
    """An aiohttp answer: reading it can raise aiohttp's errors and timeouts."""

    __slots__ = ()
    client_errors = _CLIENT_ERRORS
