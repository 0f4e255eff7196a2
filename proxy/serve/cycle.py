"""uvicorn's request-response cycle, with a response's head written with its body.

uvicorn's ``RequestResponseCycle.send`` writes the status line and headers as soon as
the app starts its response, then the body as it comes: for an answer built whole
(every non-streamed one: a ``Response`` sends its start and its body back to back) two
writes, two system calls, two segments on a ``TCP_NODELAY`` socket and two wake-ups of
the client. ``Cycle`` holds the head of a response of known length (``content-length``)
until its first body message and writes both at once: the same bytes in one write. A
response of unknown length (a stream, chunked) gets its head at once, as before: its
first event may be a while. The headers are also checked in two searches over all of
them rather than two per header (uvicorn's own patterns and errors).

Everything else is uvicorn's ``send`` (0.54, as constraints.txt pins it), step for
step; ``limits.py``'s protocol makes each request's cycle one of these (its class is
set as the request's head is parsed, before its task runs). bench/README.md has the
figures.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

# A body up to this size is joined to its head (one buffer); a larger one is handed over
# beside it.
_JOIN_BYTES = 64 * 1024
# The headers uvicorn's send reads (the others it only writes).
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))


class Cycle(RequestResponseCycle):
    _head = b""  # a head held for the first body message (its own write otherwise)

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
                )
            self.response_started = True
            self.waiting_for_100_continue = False
            head = self._render_head(message["status"], message.get("headers", ()))
            if self.chunked_encoding is False:
                self._head = head
            else:
                self.transport.write(head)
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
                )
            self._send_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already "
                "completed."
            )

    def _render_head(self, status_code: int, given: Any) -> bytes:
        headers = self.default_headers + list(given)
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status_code,
            )
        names = b"".join([name for name, _ in headers])
        values = b"".join([value for _, value in headers])
        if HEADER_RE.search(names) or HEADER_VALUE_RE.search(values):
            for name, value in headers:  # which one, as uvicorn tells it
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for raw, value in headers:
            name = raw.lower()
            content += (name, b": ", value, b"\r\n")
            if name not in _FRAMING:
                continue
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _send_body(self, body: bytes, more_body: bool) -> None:
        head, self._head = self._head, b""
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            if head:
                self.transport.write(head)
        elif self.chunked_encoding:
            content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                content.append(b"0\r\n\r\n")
            self.transport.write(b"".join(content))
        else:
            if len(body) > self.expected_content_length:
                if head:
                    self.transport.write(head)  # as uvicorn's: the head went out first
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            if not head:
                self.transport.write(body)
            elif len(body) <= _JOIN_BYTES:
                self.transport.write(head + body)
            else:  # one write still (writev), without copying a large body
                self.transport.writelines((head, body))
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()
