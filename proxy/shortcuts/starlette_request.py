"""The request object endpoints are given: Starlette's ``Request``, or one whose header
lookups read one dict.

A Starlette ``Request``'s header lookups scan and decode every header on each call; a chat
request makes about ten. ``ProxyRequest`` is the same object with ``FastHeaders``, whose
lookups read one dict built on first use, and with ``Request``'s constructor in one frame.
Both set Starlette 1.10's private attributes (``Headers._list``, ``Request._headers``,
``_receive``...): ``request_class()`` gives it on that series, else Starlette's own.
``consumed`` marks a body read from ``request.receive`` (compaction/inflight.py, without
``Request.stream()``'s async generator) as ``stream()`` would, on that series.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request, empty_receive, empty_send
from starlette.types import Receive, Scope, Send

from proxy.shortcuts.gate import on

# Header names as looked up (str) to as matched (lower-cased latin-1 bytes): the few names
# the proxy asks for, each encoded once, not on every lookup. Bounded, as names could be
# a client's (a session header name is configuration, but the bound costs nothing).
_NAMES: dict[str, bytes] = {}
_NAMES_LIMIT = 256


def _name(key: str) -> bytes:
    name = _NAMES.get(key)
    if name is None:
        name = key.lower().encode("latin-1")
        if len(_NAMES) < _NAMES_LIMIT:
            _NAMES[key] = name
    return name


class FastHeaders(Headers):
    """``Headers`` whose ``get``, ``[]`` and ``in`` are one dict lookup.

    As Starlette's, the first of repeated headers is the one returned, and names are
    matched lower-cased (ASGI servers send them lower-cased).
    """

    _first: dict[bytes, bytes] | None = None

    @classmethod
    def of(cls, scope: Scope) -> FastHeaders:
        """``FastHeaders(scope=scope)``, as ``Headers.__init__`` makes it from a scope
        (its list copied, and put back in the scope) without its keyword checks."""
        headers = cls.__new__(cls)
        headers._list = scope["headers"] = list(scope["headers"])
        return headers

    def _index(self) -> dict[bytes, bytes]:
        first = self._first
        if first is None:
            # Reversed: the first occurrence of a name is the last one written.
            first = self._first = dict(reversed(self._list))
        return first

    def __getitem__(self, key: str) -> str:
        value = (self._first or self._index()).get(_NAMES.get(key) or _name(key))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def get(self, key: str, default: Any = None) -> Any:
        # ``self._first or``, ``_NAMES.get(key) or``: the index built and the name
        # encoded already, no call (about ten lookups a request).
        value = (self._first or self._index()).get(_NAMES.get(key) or _name(key))
        return default if value is None else value.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return _name(key) in (self._first or self._index())


class _FirstHeaders:
    """``ProxyRequest.headers``: built on first use and kept in the request's own
    ``__dict__``, where every later read finds it without a call (about seven a request)."""

    def __get__(self, request: Request | None, owner: type) -> Any:
        if request is None:
            return self
        headers = request.__dict__.get("_headers")  # Starlette's own, if it built them
        if headers is None:
            headers = request._headers = FastHeaders.of(request.scope)
        request.__dict__["headers"] = headers
        return headers


class ProxyRequest(Request):
    """A ``Request`` with ``FastHeaders``."""

    headers = _FirstHeaders()

    def __init__(self, scope: Scope, receive: Receive = empty_receive, send: Send = empty_send):
        # Request's and HTTPConnection's own, in one frame: the same check and attributes
        # (tests/routes/test_endpoints.py compares them with Starlette's).
        assert scope["type"] == "http"
        self.scope = scope
        self._receive = receive
        self._send = send
        self._stream_consumed = False
        self._is_disconnected = False
        self._form = None


def request_class() -> type[Request]:
    """``ProxyRequest`` on the tested Starlette series, else Starlette's ``Request``."""
    return ProxyRequest if on("starlette") else Request


def consumed(request: Request) -> None:
    """``request``'s body was read whole: a second read raises, as after ``stream()``
    (Starlette 1.10's private flag; off that series unmarked: the proxy reads a body
    once)."""
    if on("starlette"):
        request._stream_consumed = True
