"""uvicorn's httptools protocol, bounded against slow and hostile clients.

- the request line and headers must total at most ``server.max_header_bytes``
  (else 431 and close) and arrive within ``server.header_timeout_s`` of the
  request's first byte (or of the connection opening): slowloris clients are
  dropped;
- a request body may stall at most ``server.body_timeout_s`` between reads, and
  once it has taken that long must average ``server.min_body_rate_bytes_s``;
  the connection is then dropped and the app's body read ends as a disconnect;
- the proxy speaks HTTP/1.1 only (no WebSocket protocol: a connection handed to
  one left these limits behind, held for minutes by one unanswerable request).
  A request asking to ``Upgrade`` is answered as plain HTTP (RFC 9110 7.8) and its
  connection closed after it, since the parser reads nothing more on it; one that
  also declares a body gets a 400, as the parser would not deliver that body;
- an idle connection closes ``server.keepalive_timeout_s`` after its last response
  (up to a tick late), as uvicorn's own timer would close it;
- at most ``server.max_client_connections`` connections are open at once: one
  beyond it is answered 503 (Retry-After) and closed as it opens, before it can
  send anything, while those already open are served as before. (uvicorn's own
  ``limit_concurrency`` would instead answer 503 to requests on every connection,
  the established ones too, once the total reaches it, and hold the rest open.)

Timeouts are checked by one periodic tick per server over its open
connections rather than a timer per request or per chunk: on the request path
the protocol only stores a few attributes.
"""

from __future__ import annotations

import asyncio
import logging
from itertools import chain
from typing import Any, ClassVar

from proxy.config import ServerSettings
from proxy.errors import InvalidRequest, Overloaded, ProxyError

# Named for the server whose connections these are, as before this module split off.
log = logging.getLogger("proxy.server")

_IDLE, _HEAD, _BODY = 0, 1, 2
# Ticks per (smallest) timeout: a limit is enforced within a quarter of it late.
_TICKS = 4


def limited_protocol(limits: ServerSettings) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol bounded by ``limits``; raises ImportError without it."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from proxy.shortcuts.uvicorn_cycle import request_side

    side, cycle = request_side()

    class _Bounded(_LimitsMixin, side, HttpToolsProtocol):  # type: ignore[misc, valid-type]
        parser_error = httptools.HttpParserError
        parser_upgrade = httptools.HttpParserUpgrade
        cycle_class = cycle
        max_head = limits.max_header_bytes
        head_timeout = limits.header_timeout_s
        body_timeout = limits.body_timeout_s
        min_body_rate = limits.min_body_rate_bytes_s
        keepalive = limits.keepalive_timeout_s
        tick_s = min(limits.header_timeout_s, limits.body_timeout_s, keepalive) / _TICKS
        max_connections = limits.max_client_connections
        watchdogs: ClassVar[dict[int, _Watchdog]] = {}

    return _Bounded


class _Watchdog:
    """One tick per event loop that drops connections past their head or body deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: Any, tick_s: float) -> None:
        self.loop = loop
        self.connections = connections
        self.tick_s = tick_s
        self.handle: asyncio.TimerHandle | None = None

    def ensure_running(self) -> None:
        if self.handle is None:
            self.handle = self.loop.call_later(self.tick_s, self.tick)

    def tick(self) -> None:
        now = self.loop.time()
        for connection in list(self.connections):
            check = getattr(connection, "check_deadlines", None)
            if check is not None:
                check(now)
        # Idle servers keep no timer: the next connection starts it again.
        self.handle = self.loop.call_later(self.tick_s, self.tick) if self.connections else None


class _LimitsMixin:
    """Hooks over HttpToolsProtocol; attributes it owns are reached through ``Any``."""

    parser_error: type[Exception]
    parser_upgrade: type[Exception]
    cycle_class: type[Any]
    max_head: int
    head_timeout: float
    body_timeout: float
    keepalive: float
    min_body_rate: int
    tick_s: float
    max_connections: int
    watchdogs: ClassVar[dict[int, _Watchdog]]

    _phase = _IDLE
    _since = 0.0  # head: when it began; body: when it last made progress
    _progress = False  # body bytes arrived since the last tick
    _body_bytes = 0  # of this request's body so far
    _reading_s = 0.0  # time this body was being read (not paused by us), up to the last tick
    _last_tick = 0.0
    _head_seen = 0  # bytes received while reading this request's head (may overshoot)
    _idle_since = 0.0  # when its last response ended, if nothing was received since

    def connection_made(self, transport: asyncio.Transport) -> None:
        me: Any = self
        super().connection_made(transport)  # type: ignore[misc]
        if len(me.connections) > self.max_connections:  # uvicorn counted this one
            error = Overloaded("The proxy has as many open connections as it may; retry shortly.")
            self._answer_and_close(b"503 Service Unavailable", error)
            return
        # A connection that never sends a full head is a slowloris too.
        self._phase = _HEAD
        self._since = me.loop.time()
        key = id(me.loop)
        watchdog = self.watchdogs.get(key)
        if watchdog is None or watchdog.loop is not me.loop:
            watchdog = self.watchdogs[key] = _Watchdog(me.loop, me.connections, self.tick_s)
        watchdog.ensure_running()

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = _IDLE
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        # uvicorn's own, but a parse error after our 431 must not answer a second time.
        me: Any = self
        self._idle_since = 0.0  # uvicorn's keep-alive timer, which ours never arms
        if self._phase == _HEAD:
            self._head_seen += len(data)
        else:
            self._progress = True
            self._body_bytes += len(data)
        try:
            me.parser.feed_data(data)
        except self.parser_upgrade:
            # An Upgrade request, answered as plain HTTP (on_headers_complete); the
            # parser reads no more of this connection, which closes after the answer.
            return
        except self.parser_error:
            if not me.transport.is_closing():
                me.logger.warning("Invalid HTTP request received.")
                me.send_400_response("Invalid HTTP request received.")
            return
        # httptools holds a header until it ends: a head still incomplete after
        # max_head bytes is too large, however its lines are split.
        if self._phase == _HEAD and self._head_seen > self.max_head:
            self._reject_head()

    # The parser callbacks below run for every request: plain attribute updates only.

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._idle_since = 0.0  # a request in the read that ended the last one's body
        if self._phase != _HEAD:  # the first request's clock started at connect
            me: Any = self
            self._phase = _HEAD
            self._since = me.loop.time()
            self._head_seen = 0

    def _head_too_large(self) -> None:
        self._reject_head()
        raise _Refused  # stops the parser: nothing of this request reaches the app

    def on_headers_complete(self) -> None:
        me: Any = self
        # The request line and headers, counted once they are all in (not in an on_url or
        # on_header of ours: a call each). What one read holds is all uvicorn kept
        # meanwhile; a head longer than a read is refused as it grows (data_received).
        headers = me.headers  # ": " and CRLF a header
        size = len(me.url) + sum(map(len, chain.from_iterable(headers))) + 4 * len(headers)
        if size > self.max_head:
            self._head_too_large()
        upgrade = me.parser.should_upgrade()
        if upgrade and any(
            name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0")
            for name, value in me.headers
        ):
            # The parser ends an Upgrade request at its head: its body would reach the
            # app empty and what follows would never be read.
            self._phase = _IDLE
            error = InvalidRequest("Upgrade is not supported.", code="invalid_http")
            self._answer_and_close(b"400 Bad Request", error)
            raise _Refused  # stops the parser: nothing of this request reaches the app
        self._phase = _BODY
        self._progress = True
        self._body_bytes = 0
        self._reading_s = 0.0
        self._last_tick = me.loop.time()
        # uvicorn's own (shortcuts/uvicorn_cycle.py: a response's head out with its body).
        me.start_cycle(upgrade)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        super().on_message_complete()  # type: ignore[misc]
        me: Any = self
        if me.cycle.response_complete:  # answered before its body ended: idle from now
            self._idle_since = me.loop.time()

    def on_response_complete(self) -> None:
        # uvicorn's, but an idle connection is closed by the watchdog's tick rather than
        # by a timer armed here and cancelled as the next request arrives (~1.7 µs).
        me: Any = self
        me.server_state.total_requests += 1
        if me.transport.is_closing():
            return
        me.flow.resume_reading()
        if me.pipeline:
            cycle, app = me.pipeline.pop()
            me._start_asgi_task(cycle, app)
        else:
            self._idle_since = me.loop.time()

    def check_deadlines(self, now: float) -> None:
        """Called by the watchdog's tick."""
        me: Any = self
        if self._phase == _HEAD:
            if now - self._since > self.head_timeout:
                self._drop("request head not received within header_timeout_s")
        elif self._phase == _BODY:
            cycle = me.cycle
            waiting = cycle is not None and cycle.waiting_for_100_continue
            ours = me.flow.read_paused or waiting  # we are not reading: not the client's fault
            if not ours:
                self._reading_s += now - self._last_tick
            self._last_tick = now
            if self._progress or ours:
                self._progress = False
                self._since = now
            elif now - self._since > self.body_timeout:
                self._drop("request body stalled longer than body_timeout_s")
                return
            rate, reading = self.min_body_rate, self._reading_s
            if rate and reading > self.body_timeout and self._body_bytes < rate * reading:
                self._drop("request body slower than min_body_rate_bytes_s")
        elif self._idle_since and now - self._idle_since > self.keepalive:
            self._idle_since = 0.0
            me.transport.close()  # as uvicorn's keep-alive timeout does (once)

    def _drop(self, why: str) -> None:
        me: Any = self
        self._phase = _IDLE
        log.info("dropping client %s: %s", me.client, why)
        # abort, not close: a stalled peer may not read what close would flush first.
        me.transport.abort()

    def _reject_head(self) -> None:
        me: Any = self
        if me.transport.is_closing():
            return
        self._phase = _IDLE
        error = InvalidRequest(
            f"Request line and headers are larger than the proxy's limit of {self.max_head} bytes.",
            code="request_header_fields_too_large",
        )
        self._answer_and_close(b"431 Request Header Fields Too Large", error)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to unparsable HTTP, in OpenAI's error shape."""
        self._phase = _IDLE
        self._answer_and_close(b"400 Bad Request", InvalidRequest(msg, code="invalid_http"))

    def _answer_and_close(self, status: bytes, error: ProxyError) -> None:
        me: Any = self
        body = error.body()
        retry = (
            b"retry-after: %d\r\n" % error.retry_after_s if isinstance(error, Overloaded) else b""
        )
        me.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, retry, len(body), body)
        )
        me.transport.close()


class _Refused(Exception):
    """Raised in a parser callback: the request was answered (refused); parse no more."""
