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

Everything else is uvicorn's ``send`` (0.54, the series ``gate.TESTED`` names), step for
step. ``RequestSide``, under ``limits.py``'s protocol, makes each request's cycle one of
these as its head is parsed (uvicorn's ``on_headers_complete``, step for step) and hands
it the body as it comes: a body that arrives in one piece (nearly all) reaches the app
as the very bytes the parser gave, where uvicorn appends them to a ``bytearray`` and
copies that into a new ``bytes`` (two copies: an 8 KB chat body's, or a 400 KB one's).
A ``receive`` whose body is already in awaits no ``Event.wait`` coroutine (it would
return at once). bench/README.md has the figures.

``request_side()`` picks these, or, off that series or with the shortcuts switched off,
``UvicornSide`` and uvicorn's own ``RequestResponseCycle``: the same bytes on the wire.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from proxy.shortcuts.gate import missing, on

try:  # what only the shortcuts use: another release may have moved it (then they are off)
    from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
    from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE
    from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
except ImportError as exc:
    missing("uvicorn", exc)

# A body up to this size is joined to its head (one buffer); a larger one is handed over
# beside it.
_JOIN_BYTES = 64 * 1024
# The headers uvicorn's send reads (the others it only writes).
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
# The bytes HEADER_RE and HEADER_VALUE_RE find (tests/serve/test_protocol.py: all 256).
_BAD_NAME = bytes(range(0x20)) + b'\x7f()<>@,;:[]={} \t\\"'
_BAD_VALUE = bytes(range(0x09)) + bytes(range(0x0A, 0x20)) + b"\x7f"


def _bad_value(values: tuple[bytes, ...]) -> bool:
    joined = b"".join(values)
    return len(joined.translate(None, _BAD_VALUE)) != len(joined)


class Cycle(RequestResponseCycle):
    _head = b""  # a head held for the first body message (its own write otherwise)

    async def receive(self) -> Any:
        # uvicorn's, but no Event.wait coroutine when the event is set already (it returns
        # at once: no suspension either way), and the body handed over without a copy.
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            event = self.message_event
            if not event.is_set():
                await event.wait()
            event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        # bytes(x) is x itself for bytes (RequestSide.on_body's): no copy.
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = b""  # type: ignore[assignment]  # bytes or bytearray, both read as bytes
        return message

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
        names, values = zip(*headers, strict=True) if headers else ((), ())
        joined = b"".join(names)
        # HEADER_RE's and HEADER_VALUE_RE's searches, as a deletion of their bytes (in C).
        if len(joined.translate(None, _BAD_NAME)) != len(joined) or _bad_value(values):
            for name, value in headers:  # which one, as uvicorn tells it
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
        if (
            self.chunked_encoding is None
            and names.count(b"content-length") == 1
            and b"transfer-encoding" not in names
            and b"connection" not in names
            and joined.lower() == joined
        ):  # the common answer: what the loop below does, without lowering each name
            self.expected_content_length = int(values[names.index(b"content-length")].decode())
            self.chunked_encoding = False
            lines = b"\r\n".join(map(b": ".join, headers))
            close = b"" if self.keep_alive else b"connection: close\r\n"
            return b"%s%s\r\n%s\r\n" % (STATUS_LINE[status_code], lines, close)
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


class RequestSide:
    """uvicorn 0.54's ``HttpToolsProtocol`` request callbacks from the head on, step for
    step, the request's cycle made as ``cycle_class`` from the start and its body kept as
    the parser's bytes when it comes in one piece. Attributes are uvicorn's."""

    cycle_class: type[Any]

    def start_cycle(self, upgrade: bool) -> None:
        """uvicorn's ``on_headers_complete``; ``upgrade``: the parser's should_upgrade()."""
        me: Any = self
        parser, scope = me.parser, me.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if upgrade and me._should_upgrade():
            return
        parsed_url = httptools.parse_url(me.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root_path = me.root_path
        scope["path"] = root_path + path
        scope["raw_path"] = root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        limit = me.limit_concurrency
        if limit is not None and (len(me.connections) >= limit or len(me.tasks) >= limit):
            app = service_unavailable
            message = "Exceeded concurrency limit."
            me.logger.warning(message)
        else:
            app = me.app
        existing_cycle = me.cycle
        me.cycle = cycle = self.cycle_class(
            scope,
            me.transport,
            me.flow,
            me.logger,
            me.access_logger,
            me.access_log,
            me.server_state.default_headers,
            asyncio.Event(),
            me.expect_100_continue,
            http_version != "1.0" and parser.should_keep_alive(),
            me.on_response_complete,
        )
        if upgrade:  # answered as plain HTTP, then closed (limits.py)
            cycle.keep_alive = False
        if existing_cycle is None or existing_cycle.response_complete:
            me._start_asgi_task(cycle, app)
        else:
            me.flow.pause_reading()
            me.pipeline.appendleft((cycle, app))

    def on_body(self, body: bytes) -> None:
        me: Any = self
        cycle = me.cycle
        if (me.parser.should_upgrade() and me._should_upgrade()) or cycle.response_complete:
            return
        held = cycle.body
        if not held:
            held = cycle.body = body  # the parser's own bytes object: kept, not copied
        elif type(held) is bytes:
            held = cycle.body = bytearray(held)
            held += body
        else:
            held += body
        if len(held) > HIGH_WATER_LIMIT:
            me.flow.pause_reading()
        cycle.message_event.set()


class UvicornSide:
    """The public path beside ``RequestSide``: uvicorn's own ``on_headers_complete`` and
    ``on_body``, and its own cycle (``cycle_class``)."""

    cycle_class: type[Any] = RequestResponseCycle

    def start_cycle(self, upgrade: bool) -> None:
        """uvicorn's ``on_headers_complete``; an ``upgrade`` request's connection closes
        after its answer, as ``RequestSide`` leaves it."""
        me: Any = self
        before = me.cycle
        HttpToolsProtocol.on_headers_complete(me)
        if upgrade and me.cycle is not before:
            me.cycle.keep_alive = False


def request_side() -> tuple[type[Any], type[Any]]:
    """The protocol's request side and the cycle class it makes: ours on the tested
    uvicorn series, else uvicorn's own."""
    return (RequestSide, Cycle) if on("uvicorn") else (UvicornSide, RequestResponseCycle)
