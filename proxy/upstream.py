"""Talking to the upstream provider: headers, sending, relaying, error translation.

This is the one place that knows about the HTTP client: an aiohttp session,
chosen with numbers (bench/README.md). On this machine a minimal passthrough
on httpx's own pool served ~70 req/s against a 50 ms upstream at c=64, on
httpx over an aiohttp transport ~550, and on aiohttp directly ~890.
``UpstreamClient`` owns the session; everything else sees ``UpstreamClient``,
``UpstreamResponse`` and the proxy's own errors, never an aiohttp one.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from multidict import CIMultiDictProxy
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from yarl import URL

from proxy.config import Settings
from proxy.errors import (
    InvalidRequest,
    UpstreamError,
    UpstreamStreamBroken,
    UpstreamTimeout,
    UpstreamUnavailable,
)

log = logging.getLogger("proxy.upstream")

# RFC 9110 7.6.1 hop-by-hop headers, plus what the HTTP client recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_HOP_BY_HOP_RAW = frozenset(h.encode() for h in HOP_BY_HOP)
CONTROL_HEADERS = frozenset({"x-compaction"})
# The proxy's own header family (x-compaction-purpose marks its summarizer calls):
# a client's copy must never reach the upstream looking like the proxy's.
_CONTROL_PREFIX = "x-compaction-"
# Headers the summarizer's own upstream calls carry: credentials and billing scope.
AUTH_HEADERS = frozenset(
    {b"authorization", b"api-key", b"x-api-key", b"openai-organization", b"openai-project"}
)
# What the client raises: aiohttp's tree, and timeouts (total, sock_read, sock_connect).
_CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# Request bodies bigger than this are written in chunks (aiohttp warns about larger bytes).
_WRITE_IN_CHUNKS = 1024 * 1024
# Responses bigger than this (or of unknown size) are streamed, not buffered.
_BUFFER_LIMIT = 1024 * 1024
# aiohttp adds these when absent; the proxy sends what the client sent, no more.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Content-Type")
# RFC 3986 pchar, "/" and "%": the only bytes a passthrough path may carry on the wire.
_PATH_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/%"
# Bytes a decoded path must not hold: "%" would decode again (%252e -> %2e -> .),
# "\\" is a separator to some servers, ";" starts path parameters that servlet
# containers strip ("..;" is ".." there), controls can split or truncate the request.
_UNSAFE_DECODED = bytes(range(0x20)) + b"\x7f%\\;"
# Printable ASCII but "#": a query is relayed byte for byte and must stay one.
_QUERY_BYTES = bytes(b for b in range(0x21, 0x7F) if b != ord("#"))
_BAD_PATH = "Invalid path: only plain paths under /v1/ are forwarded."


def _translated(exc: BaseException, *, body: bool) -> UpstreamError:
    """The one place the HTTP client's exceptions become the proxy's; callers raise
    the result ``from exc``. ``body``: the status and headers had already arrived, so
    the failure broke a body off, which a relayed stream can only end early on.

    (A function, not httpx's mapping context manager: ``with`` costs ~0.2 us per use
    on the request path, a ``try`` nothing until something fails.)
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


class UpstreamClient:
    """The one upstream HTTP client: an aiohttp session with the timeouts and limits
    from settings. The app's lifespan builds it and ``aclose``s it; requests share it.

    Must be constructed inside the running event loop.
    """

    __slots__ = ("_session",)

    def __init__(self, settings: Settings) -> None:
        up = settings.upstream
        connector = aiohttp.TCPConnector(limit=up.max_connections, keepalive_timeout=60)
        # aiohttp's total runs from send until the connection is released, so it also
        # bounds reading a streamed body, not just the wait for headers.
        timeout = aiohttp.ClientTimeout(
            total=up.total_timeout_s, sock_connect=up.connect_timeout_s, sock_read=up.timeout_s
        )
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
        try:
            response = await self._session.request(
                method,
                url,
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                data=data,
                allow_redirects=False,
            )
        except _CLIENT_ERRORS as exc:
            raise _translated(exc, body=False) from exc
        return UpstreamResponse(response)

    async def aclose(self) -> None:
        await self._session.close()


class UpstreamResponse:
    """An upstream answer with its body not yet read; ``aclose`` it when done.

    Reading the body raises ``UpstreamStreamBroken`` if the connection breaks or
    times out meanwhile.
    """

    __slots__ = ("_response", "started")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
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
            raise _translated(exc, body=True) from exc

    async def aread(self) -> bytes:
        try:
            return await self._response.read()
        except _CLIENT_ERRORS as exc:
            raise _translated(exc, body=True) from exc

    async def aclose(self) -> None:
        # A body read to the end frees the connection for reuse; anything else
        # (a client that went away mid-stream) closes it, which is what tells
        # the upstream to stop generating.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class HeaderPolicy:
    """Which request headers go upstream, computed once from settings."""

    def __init__(self, settings: Settings) -> None:
        self.drop = HOP_BY_HOP | CONTROL_HEADERS | {settings.session.header.lower()}
        self._drop_inspect = self.drop | {"accept-encoding"}
        key = settings.upstream.api_key.get_secret_value()
        self.authorization = f"Bearer {key}" if key else None

    def outgoing(
        self, headers: Iterable[tuple[bytes, bytes]], *, inspect: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Headers for the upstream. ``inspect``: the proxy reads the answer (overflow
        errors, usage), so it is asked for uncompressed bytes."""
        headers = list(headers)
        drop = self._drop_inspect if inspect else self.drop
        # RFC 9110 7.6.1: what the client's Connection header names is for this hop only.
        options = [v for k, v in headers if k.lower() == b"connection"]
        if options:
            named = {t.strip().lower() for v in options for t in v.decode("latin-1").split(",")}
            drop = drop | named
        out = []
        for k, v in headers:
            name = k.decode("latin-1").lower()
            if name not in drop and not name.startswith(_CONTROL_PREFIX):
                out.append((k, v))
        if inspect:
            out.append((b"accept-encoding", b"identity"))
        if self.authorization is not None:
            out = [(k, v) for k, v in out if k.lower() != b"authorization"]
            out.append((b"authorization", self.authorization.encode("latin-1")))
        return out

    @staticmethod
    def auth_only(outgoing: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in outgoing if k.lower() in AUTH_HEADERS]


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """``base_url`` + a path of the proxy's own choosing (never a client's: see
    ``passthrough_url``)."""
    url = base_url.rstrip("/") + "/" + path.lstrip("/")
    return f"{url}?{query.decode('latin-1')}" if query else url


def passthrough_url(base_url: str, path: str, raw_path: bytes | None, query: bytes) -> URL:
    """``base_url`` + the client's path after ``/v1``, as the client encoded it.

    Raises ``InvalidRequest`` for anything that could resolve outside ``base_url``'s
    path, here or at the upstream: dot segments, encoded separators or dots that a
    second decoding would turn into them, backslashes, controls. The URL is marked
    encoded, so neither yarl nor aiohttp normalises it again.
    """
    raw = raw_path if raw_path is not None else quote(path).encode("ascii")
    if not raw.startswith(b"/v1/") or raw.translate(None, _PATH_BYTES):
        raise InvalidRequest(_BAD_PATH, code="invalid_path")
    decoded = unquote_to_bytes(raw)
    segments = decoded.split(b"/")
    if (
        len(decoded.translate(None, _UNSAFE_DECODED)) != len(decoded)
        or b".." in segments
        or b"." in segments
        # What the router matched must be what is forwarded (it differs on invalid UTF-8).
        or decoded != path.encode("utf-8", "surrogatepass")
    ):
        raise InvalidRequest(_BAD_PATH, code="invalid_path")
    if query.translate(None, _QUERY_BYTES):
        raise InvalidRequest("Invalid query string.", code="invalid_path")
    url = _base_path(base_url) + raw[3:].decode("ascii")
    if query:
        url = f"{url}?{query.decode('ascii')}"
    return URL(url, encoded=True)


@lru_cache(maxsize=4)
def _base_path(base_url: str) -> str:
    # The configured base, encoded once; the client's path is appended verbatim.
    return str(URL(base_url)).rstrip("/")


def response_headers(response: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in response.raw_headers if k.lower() not in _HOP_BY_HOP_RAW]


def buffered(
    response: UpstreamResponse, body: bytes, extra_headers: Iterable[tuple[bytes, bytes]] = ()
) -> Response:
    """An upstream answer whose raw body was already read: relay it as received."""
    out = Response(body, status_code=response.status_code)
    length = (b"content-length", str(len(body)).encode())
    out.raw_headers = [*response_headers(response), *extra_headers, length]
    return out


async def relay(
    response: UpstreamResponse,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
    watch: Callable[[bytes], None] | None = None,
    started: tuple[bytes, AsyncIterator[bytes]] | None = None,
) -> Response:
    """Turn an upstream response into ours: status, headers and bytes as received.

    Event streams and large bodies are relayed chunk by chunk as they arrive;
    small bodies are read whole, which is cheaper than streaming them.
    ``watch`` sees the body's bytes (each chunk of a stream) on their way out.
    ``started``: bytes the caller already read, and the iterator it read them from.
    """
    headers = response_headers(response)
    headers.extend(extra_headers)
    started = started or response.started
    length = response.headers.get("content-length")
    is_stream = response.headers.get("content-type", "").startswith("text/event-stream")
    small = (
        length is not None
        and length.isascii()
        and length.isdigit()
        and int(length) <= _BUFFER_LIMIT
    )
    if not is_stream and small and started is None:
        try:
            # Raw bytes (auto_decompress is off): the content-encoding header is
            # relayed, so must the encoding be.
            body = await response.aread()
        finally:
            await response.aclose()
        if watch is not None:
            watch(body)
        out = Response(body, status_code=response.status_code)
        out.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        return out
    out = StreamingResponse(
        _raw_chunks(response, watch, started),
        status_code=response.status_code,
        background=BackgroundTask(response.aclose),
    )
    out.raw_headers = headers
    return out


async def _raw_chunks(
    response: UpstreamResponse,
    watch: Callable[[bytes], None] | None,
    started: tuple[bytes, AsyncIterator[bytes]] | None = None,
) -> AsyncIterator[bytes]:
    # Bytes exactly as received (no decompression, no re-serialization). If the
    # client disconnects, Starlette cancels this generator and the finally
    # closes the upstream connection, which cancels the upstream request.
    prefix, source = started if started is not None else (b"", response.aiter_raw())
    try:
        if prefix:
            if watch is not None:
                watch(prefix)
            yield prefix
        async for chunk in source:
            if watch is not None:
                watch(chunk)
            yield chunk
    except UpstreamStreamBroken as exc:
        # Headers are already sent: all we can do is end the stream early, cleanly,
        # so the client keeps what it got. The cause names a timeout or a lost connection.
        log.warning("upstream stream broke mid-body: %s", type(exc.__cause__).__name__)
    finally:
        await response.aclose()
