"""The one upstream HTTP client, the one place that knows it: an aiohttp session, chosen
with numbers (bench/README.md, "Figures behind the code"). All else sees ``UpstreamClient``,
``UpstreamResponse`` and the proxy's errors, never aiohttp's. Which headers go
(``headers.py``), where (``urls.py``) and how an answer goes back (``relay.py``) are
decided around it."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable

import aiohttp
from aiohttp.client import IDEMPOTENT_METHODS
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from proxy.config import Settings
from proxy.errors import UpstreamUnavailable
from proxy.errors import upstream_failure as _translated
from proxy.shortcuts.aiohttp_request import SKIP_SET, LeanRequest, lean_request, on_path
from proxy.upstream.deadline import Deadlines
from proxy.upstream.response import UpstreamResponse as UpstreamResponse
from proxy.upstream.urls import plain_url

# What the client raises: aiohttp's tree, and timeouts (sock_read, sock_connect; deadline.py)
_CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# Request bodies bigger than this are written in chunks (aiohttp warns about larger bytes).
_WRITE_IN_CHUNKS = 1024 * 1024


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
        # aiohttp 3.14's internals, or aiohttp's own request and path (shortcuts/).
        lean = on_path()
        self._lean = lean and proxy is None
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,  # bytes are relayed exactly as the upstream sent them
            # aiohttp adds these when absent; the proxy sends what the client sent, no more.
            skip_auto_headers=SKIP_SET,
            # One session serves every tenant: an upstream's cookies must never be
            # stored and replayed on someone else's requests.
            cookie_jar=aiohttp.DummyCookieJar(),
            proxy=proxy,
            proxy_auth=proxy_auth,
            request_class=LeanRequest if lean else aiohttp.ClientRequest,
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

    def _request(
        self, method: str, url: str | URL, headers: list[tuple[str, str]], data: object
    ) -> Awaitable[aiohttp.ClientResponse]:
        """``session.request``. A POST to a plain URL (the proxy's own calls) skips what of
        ``ClientSession._request`` this session never uses (shortcuts/aiohttp_request.py):
        the same request, head and errors. Not a coroutine of its own: the caller awaits
        the one it returns (a frame less each time the request resumes)."""
        session = self._session
        # (aiohttp retries an idempotent call once on a stale connection: not here)
        plain = plain_url(url) if self._lean and method.upper() not in IDEMPOTENT_METHODS else None
        if plain is None or session.closed:
            return session.request(method, url, headers=headers, data=data, allow_redirects=False)
        return lean_request(session, method, plain, headers, data)

    async def aclose(self) -> None:
        self._deadlines.close()
        await self._session.close()


class _Response(UpstreamResponse):
    """An aiohttp answer: reading it can raise aiohttp's errors and timeouts."""

    __slots__ = ()
    client_errors = _CLIENT_ERRORS
