"""The request headers endpoints read: looked up in one dict, answering as Starlette's do."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers
from starlette.requests import Request

from proxy.shortcuts.starlette_request import FastHeaders, ProxyRequest

# Tests of the shortcuts themselves: on, whatever the run's switch.
pytestmark = pytest.mark.usefixtures("shortcuts_on")

RAW = [
    (b"content-type", b"application/json"),
    (b"x-session-id", b"first"),
    (b"authorization", b"Bearer sk-\xe9"),
    (b"x-session-id", b"second"),
]


def test_fast_headers_answer_as_starlettes_headers() -> None:
    ours, theirs = FastHeaders(scope={"headers": RAW}), Headers(scope={"headers": RAW})
    for name in ("x-session-id", "X-Session-Id", "authorization", "content-type", "absent"):
        assert ours.get(name) == theirs.get(name)
        assert ours.get(name, "fallback") == theirs.get(name, "fallback")
        assert (name in ours) == (name in theirs)
    assert ours["X-SESSION-ID"] == theirs["X-SESSION-ID"] == "first"  # the first of repeats
    assert ours.getlist("x-session-id") == ["first", "second"]
    assert ours.raw == RAW


def test_a_proxy_request_reads_one_fast_headers_object() -> None:
    request = ProxyRequest({"type": "http", "headers": RAW})
    headers = request.headers
    assert isinstance(headers, FastHeaders)
    assert request.headers is headers is request._headers  # built once, kept
    assert headers.get("x-session-id") == "first"
    other = ProxyRequest({"type": "http", "headers": RAW[:1]})
    assert other.headers.get("x-session-id") is None  # each request its own
    assert request.headers is headers


def test_a_proxy_request_is_built_as_starlettes_request() -> None:
    """ProxyRequest sets Request's attributes in one frame of its own: the same ones."""

    async def receive() -> dict[str, str]:
        return {"type": "http.request"}

    async def send(message: object) -> None:
        pass

    for args in (({"type": "http", "headers": RAW},), ({"type": "http"}, receive, send)):
        assert vars(ProxyRequest(*args)) == vars(Request(*args))  # type: ignore[arg-type]
    scope = {"type": "http", "headers": tuple(RAW)}
    ours, theirs = ProxyRequest(scope).headers, Headers(scope={"headers": tuple(RAW)})
    assert vars(ours) == vars(theirs)
    assert scope["headers"] == RAW  # put back, as a list
    assert isinstance(scope["headers"], list)
