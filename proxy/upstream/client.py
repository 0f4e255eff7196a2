"""The one upstream HTTP client: sending, and error translation.

This is the one place that knows about the HTTP client: an aiohttp session,
chosen with numbers: a minimal passthrough on aiohttp served an order of magnitude
more than on httpx's own pool, and well more than httpx over an aiohttp transport
(bench/README.md, "Figures behind the code").
``UpstreamClient`` owns the session; everything else sees ``UpstreamClient``,
``UpstreamResponse`` and the proxy's own errors, never an aiohttp one. Which
headers go (``headers.py``), where (``urls.py``) and how an answer goes back to
the client (``relay.py``) are decided around it.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

import aiohttp
from aiohttp import hdrs
from aiohttp.helpers import get_env_proxy_for_url
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from proxy.config import Settings
from proxy.errors import (
    UpstreamError,
    UpstreamStreamBroken,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.upstream.deadline import Deadline, Deadlines

# What the client raises: aiohttp's tree, and timeouts (sock_read, sock_connect; the total
# is deadline.py's).
_CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# Request bodies bigger than this are written in chunks (aiohttp warns about larger bytes).
_WRITE_IN_CHUNKS = 1024 * 1024
# aiohttp adds these when absent; the proxy sends what the client sent, no more.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Content-Type")


class _Request(aiohttp.ClientRequest):
    """aiohttp's request, its automatic headers decided once for the session's skip set
    (``_SKIP_AUTO_HEADERS``) rather than per call: aiohttp builds a sorted ``CIMultiDict``
    of the skip set, copies the headers and merges the two on every call, ~3 µs of the
    ~80 a call costs (bench/README.md, "Saturation, session of 2026-11-26: the upstream
    call"). The same headers in the same order: tests/upstream/test_request_head.py."""

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        if skip_auto_headers != _SKIP_SET:  # not the session's: aiohttp's own way
            super().update_auto_headers(skip_auto_headers)
            return
        self._skip_auto_headers = _SKIP
        headers = self.headers
        for name, value in _AUTO:
            if name not in headers:
                headers[name] = value


_SKIP_SET = frozenset(istr(name) for name in _SKIP_AUTO_HEADERS)  # as the session keeps it
_SKIP: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(_SKIP_SET))
# What aiohttp adds when the caller sent none and the session does not skip, in its order.
_AUTO = tuple(
    (name, value)
    for name, value in [*_Request.DEFAULT_HEADERS.items(), (hdrs.USER_AGENT, SERVER_SOFTWARE)]
    if name not in _SKIP
)


def _translated(exc: BaseException, *, body: bool) -> UpstreamError:
    """The one place the HTTP client's exceptions become the proxy's; callers raise
    the result ``from exc``. ``body``: the status and headers had already arrived, so
    the failure broke a body off, which a relayed stream can only end early on.

    (A function, not httpx's mapping context manager: ``with`` costs on every use on the
    request path, a ``try`` nothing until something fails; bench/README.md.)
    """
    timed_out = isinstance(exc, asyncio.TimeoutError)  # includes ServerTimeoutError
    if body:
        message = (
            "The upstream did not finish its answer in time."
            if timed_out
            else "The upstream connection broke mid-answer."
        )
        return UpstreamStreamBroken(message, timed_out=timed_out)
    if timed_out:
        return UpstreamTimeout("The upstream did not answer in time.")
    return UpstreamUnavailable("The upstream could not be reached.")


class Upstream(Protocol):
    """The upstream seam: what requests and the summarizer need of ``UpstreamClient``
    (tests put an in-process fake behind it, ``tests/support/fakes.py``)."""

    async def send(
        self,
        method: str,
        url: str | URL,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


class UpstreamClient:
    """The one upstream HTTP client: an aiohttp session with the timeouts and limits
    from settings. The app's lifespan builds it and ``aclose``s it; requests share it.

    Must be constructed inside the running event loop.
    """

    __slots__ = ("_deadlines", "_session")

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
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,  # bytes are relayed exactly as the upstream sent them
            skip_auto_headers=_SKIP_AUTO_HEADERS,
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
            response = await self._session.request(
                method,
                url,
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                data=data,
                allow_redirects=False,
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
        return UpstreamResponse(response, deadline, self._deadlines)

    async def aclose(self) -> None:
        self._deadlines.close()
        await self._session.close()


class UpstreamResponse:
    """An upstream answer with its body not yet read; ``aclose`` it when done.

    Reading the body raises ``UpstreamStreamBroken`` if the connection breaks or
    times out meanwhile.
    """

    __slots__ = ("_deadline", "_deadlines", "_response", "started")

    def __init__(
        self, response: aiohttp.ClientResponse, deadline: Deadline, deadlines: Deadlines
    ) -> None:
        self._response = response
        self._deadline, self._deadlines = deadline, deadlines
        # Bytes a caller already read (peeking at a stream's first event) and the
        # iterator it read them from: ``relay`` sends them first.
        self.started: tuple[bytes, AsyncIterator[bytes]] | None = None

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._response.headers

    @property
    def raw_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return self._response.raw_headers

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (still content-encoded)."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except _CLIENT_ERRORS as exc:
            cause = self._cut(exc)
            raise _translated(cause, body=True) from cause
        if self._deadline.expired:  # closed at its deadline: never a complete answer
            cause = TimeoutError()
            raise _translated(cause, body=True) from cause

    async def aread(self) -> bytes:
        try:
            return await self._response.read()
        except _CLIENT_ERRORS as exc:
            cause = self._cut(exc)
            raise _translated(cause, body=True) from cause

    async def aread_closed(self) -> bytes:
        """``aread`` then ``aclose``, in one step: a body read to its end has freed its
        connection already (aiohttp releases it at the body's end), so closing is only
        ending the deadline."""
        try:
            body = await self._response.read()
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, _CLIENT_ERRORS):
                cause = self._cut(exc)
                raise _translated(cause, body=True) from cause
            raise
        self._deadlines.end(self._deadline)
        if not self._response.closed:  # (never seen: aiohttp closed it at the body's end)
            self._response.release()
        return body

    def _cut(self, exc: BaseException) -> BaseException:
        # A body its deadline cut off (by closing the response) timed out.
        return TimeoutError() if self._deadline.expired else exc

    async def aclose(self) -> None:
        # A body read to the end frees the connection for reuse; anything else
        # (a client that went away mid-stream) closes it, which is what tells
        # the upstream to stop generating.
        self._deadlines.end(self._deadline)
        response = self._response
        if response.content.at_eof():
            if not response.closed:  # aiohttp closes it, connection freed, at the body's end
                response.release()
        else:
            response.close()
