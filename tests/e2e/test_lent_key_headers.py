"""Issue 20 item 13: with the proxy's own key lent (upstream.api_key), the caller's
own credential, billing-scope and origin headers stay at the proxy, on every route
that calls the upstream, unless upstream.forward_client_headers names them; without a
lent key they go through as before."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.servers import proxy_settings, run_server

CALLER = {
    "Authorization": "Bearer sk-client",
    "x-api-key": "sk-client-x",
    "api-key": "sk-client-azure",
    "OpenAI-Organization": "org-client",
    "OpenAI-Project": "proj-client",
    "Forwarded": "for=203.0.113.9;proto=https",
    "X-Forwarded-For": "203.0.113.9",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "evil.example",
    "X-Real-IP": "203.0.113.9",
    "X-Kept": "k",
}
WITHHELD = [name.lower() for name in CALLER if name not in ("Authorization", "X-Kept")]
ROUTES = [
    (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("POST", "/v1/responses", {"model": "m", "input": "hi"}),
    ("GET", "/v1/models", None),
    ("POST", "/v1/embeddings", {"model": "m", "input": "hi"}),
]


class _Upstream:
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.asked: list[dict[str, str]] = []  # the proxy's own questions about its models

    async def record(self, request: Request) -> Response:
        await request.body()
        asking = request.headers.get("x-compaction-purpose") == "discover"
        (self.asked if asking else self.seen).append(dict(request.headers))
        return JSONResponse({"object": "list", "data": []})


@pytest.fixture
def upstream() -> Iterator[tuple[str, _Upstream]]:
    recorder = _Upstream()
    app = Starlette(routes=[Route("/{path:path}", recorder.record, methods=["GET", "POST"])])
    with run_server(app) as url:
        yield url, recorder


def _call_every_route(proxy: str, recorder: _Upstream) -> list[dict[str, str]]:
    for method, path, body in ROUTES:
        r = httpx.request(method, f"{proxy}{path}", headers=CALLER, json=body, timeout=10)
        assert r.status_code == 200, (path, r.text)
    assert len(recorder.seen) == len(ROUTES)
    return recorder.seen


def _start(start_proxy: Callable[..., str], url: str, **upstream: Any) -> str:
    return str(start_proxy(proxy_settings(url, upstream=upstream)))


def test_a_lent_key_carries_none_of_the_callers_own_headers(
    upstream: tuple[str, _Upstream], start_proxy: Callable[..., str]
) -> None:
    url, recorder = upstream
    proxy = _start(start_proxy, url, api_key="sk-proxy")
    for (_, path, _), seen in zip(ROUTES, _call_every_route(proxy, recorder), strict=True):
        assert seen["authorization"] == "Bearer sk-proxy", path
        assert seen["x-kept"] == "k", path
        assert [name for name in WITHHELD if name in seen] == [], path
    # The proxy's own question about its models asks with its key, and nothing of the caller.
    deadline = time.monotonic() + 10  # asked in the background, after the first request
    while not recorder.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder.asked
    for asked in recorder.asked:
        assert asked["authorization"] == "Bearer sk-proxy"
        assert [name for name in [*WITHHELD, "x-kept"] if name in asked] == []


def test_allow_listed_headers_go_with_a_lent_key(
    upstream: tuple[str, _Upstream], start_proxy: Callable[..., str]
) -> None:
    url, recorder = upstream
    allowed = ["OpenAI-Organization", "x-forwarded-for"]
    proxy = _start(start_proxy, url, api_key="sk-proxy", forward_client_headers=allowed)
    for (_, path, _), seen in zip(ROUTES, _call_every_route(proxy, recorder), strict=True):
        assert seen["authorization"] == "Bearer sk-proxy", path
        assert seen["openai-organization"] == "org-client", path
        assert seen["x-forwarded-for"] == "203.0.113.9", path
        others = [n for n in WITHHELD if n not in ("openai-organization", "x-forwarded-for")]
        assert [name for name in others if name in seen] == [], path


def test_without_a_lent_key_the_callers_headers_go_as_sent(
    upstream: tuple[str, _Upstream], start_proxy: Callable[..., str]
) -> None:
    url, recorder = upstream
    proxy = _start(start_proxy, url)
    for (_, path, _), seen in zip(ROUTES, _call_every_route(proxy, recorder), strict=True):
        assert seen["authorization"] == "Bearer sk-client", path
        for name, value in CALLER.items():
            assert seen[name.lower()] == value, (path, name)
