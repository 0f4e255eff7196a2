"""An upstream answer as the proxy sees it: status, headers, and a body read whole or as it
comes, then closed. It does not know the HTTP client: ``client.py`` answers with its
subclass, which names the client's errors (tests/upstream/test_upstream_client.py holds
aiohttp to that one module).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar, Protocol

from multidict import CIMultiDictProxy

from proxy.errors import upstream_failure as _translated
from proxy.upstream.deadline import Deadline, Deadlines


class _Body(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]: ...
    def at_eof(self) -> bool: ...


class ClientAnswer(Protocol):
    """What of the HTTP client's response (aiohttp's ``ClientResponse``) is used here."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> CIMultiDictProxy[str]: ...
    @property
    def raw_headers(self) -> tuple[tuple[bytes, bytes], ...]: ...
    @property
    def content(self) -> _Body: ...
    @property
    def closed(self) -> bool: ...
    async def read(self) -> bytes: ...
    def release(self) -> object: ...
    def close(self) -> None: ...


class UpstreamResponse:
    """An upstream answer with its body not yet read; ``aclose`` it when done. Reading the
    body raises ``UpstreamStreamBroken`` if the connection breaks or times out meanwhile."""

    __slots__ = ("_deadline", "_deadlines", "_response", "started")
    # What reading can raise that is the upstream's failure: the HTTP client's errors.
    client_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(self, response: ClientAnswer, deadline: Deadline, deadlines: Deadlines) -> None:
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
        except self.client_errors as exc:
            cause = self._cut(exc)
            raise _translated(cause, body=True) from cause
        if self._deadline.expired:  # closed at its deadline: never a complete answer
            cause = TimeoutError()
            raise _translated(cause, body=True) from cause

    async def aread_at_most(self, limit: int) -> bytes | None:
        """The body, or None when it is longer than ``limit`` bytes: reading stops past the
        bound, and a ``content-length`` over it is not read at all. ``aclose`` it after
        either way (a body not read to its end then closes its connection)."""
        length = self.headers.get("content-length")
        if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        async for chunk in self.aiter_raw():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def aread_or_rest(self, limit: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
        """The body whole, the response closed; or, once past ``limit`` bytes, what was
        read and the iterator for the rest, the response open: the caller relays it as
        it is (an answer too big to parse is still the client's). Bytes a caller already
        read (``started``) come first."""
        prefix, source = self.started or (b"", self.aiter_raw())
        self.started = None
        chunks = [prefix]
        size = len(prefix)
        try:
            async for chunk in source:
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    return b"".join(chunks), source
        except BaseException:  # the upstream broke, or the client left: free the connection
            await self.aclose()
            raise
        await self.aclose()
        return b"".join(chunks), None

    async def aread_closed(self) -> bytes:
        """The whole body, then ``aclose``, in one step: unbounded, for an answer relayed
        as it came (relay.py); a body the proxy itself parses is read with
        ``aread_at_most``. A body read to its end has freed its connection already
        (aiohttp does at the body's end): closing is ending the deadline."""
        try:
            body = await self._response.read()
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, self.client_errors):
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
