"""Issue 2: the proxy is invisible. Same answers as talking to the upstream directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import OPEN_CLIENTS, proxy_settings

CHAT = {
    "model": "sim-model",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something about proxies."},
    ],
}


def _sdk(base: str, **kw: Any) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0, **kw)
    OPEN_CLIENTS.append(client)
    return client


def test_non_streamed_reply_is_byte_identical_to_direct(proxy: str, simulator: str) -> None:
    direct = httpx.post(f"{simulator}/v1/chat/completions", json=CHAT)
    proxied = httpx.post(f"{proxy}/v1/chat/completions", json=CHAT)
    assert direct.status_code == proxied.status_code == 200
    assert proxied.content == direct.content
    assert proxied.headers["content-type"] == direct.headers["content-type"]


def test_sdk_sync_and_async_get_the_same_completion(proxy: str, simulator: str) -> None:
    direct = _sdk(simulator).chat.completions.create(**CHAT)  # type: ignore[call-overload]
    with _sdk(proxy) as client:
        via = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert via.model_dump() == direct.model_dump()
    assert via.choices[0].message.content


async def test_async_sdk_streams_the_same_chunks(proxy: str, simulator: str) -> None:
    async def chunks(base: str) -> list[dict[str, Any]]:
        async with openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="sk-test", max_retries=0
        ) as client:
            stream = await client.chat.completions.create(
                **CHAT, stream=True, stream_options={"include_usage": True}
            )
            return [c.model_dump() async for c in stream]

    direct, via = await chunks(simulator), await chunks(proxy)
    assert via == direct
    assert len(via) > 2
    assert via[-1]["usage"]["prompt_tokens"] > 0


def test_stream_bytes_are_relayed_unchanged(proxy: str, simulator: str) -> None:
    body = {**CHAT, "stream": True}
    direct = httpx.post(f"{simulator}/v1/chat/completions", json=body)
    proxied = httpx.post(f"{proxy}/v1/chat/completions", json=body)
    assert proxied.content == direct.content
    assert proxied.headers["content-type"].startswith("text/event-stream")
    assert proxied.content.endswith(b"data: [DONE]\n\n")


def test_stream_chunks_arrive_before_the_upstream_finishes(proxy: str) -> None:
    """Chunks are relayed as they arrive: the first one lands long before the last."""
    import time

    headers = {"X-Sim-Chunk-Delay-Ms": "150"}
    body = {**CHAT, "stream": True}
    start = time.monotonic()
    arrivals = []
    with httpx.stream(
        "POST", f"{proxy}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) >= 4
    assert arrivals[-1] - arrivals[0] >= 0.15 * (len(arrivals) - 2)
    assert arrivals[0] < arrivals[-1] / 2


@pytest.mark.parametrize(
    ("status", "exc"),
    [
        (401, openai.AuthenticationError),
        (404, openai.NotFoundError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
def test_upstream_errors_reach_the_sdk_unchanged(
    proxy: str, simulator: str, status: int, exc: type[Exception]
) -> None:
    headers = {"X-Sim-Fail": str(status)}
    direct = httpx.post(f"{simulator}/v1/chat/completions", json=CHAT, headers=headers)
    proxied = httpx.post(f"{proxy}/v1/chat/completions", json=CHAT, headers=headers)
    assert proxied.status_code == direct.status_code == status
    assert proxied.content == direct.content
    if status == 429:
        assert proxied.headers["retry-after"] == direct.headers["retry-after"]
    with pytest.raises(exc) as info:
        _sdk(proxy).chat.completions.create(**CHAT, extra_headers=headers)  # type: ignore[call-overload]
    assert info.value.status_code == status  # type: ignore[attr-defined]


def test_other_endpoints_pass_through(proxy: str, simulator: str) -> None:
    direct, via = _sdk(simulator), _sdk(proxy)
    assert [m.id for m in via.models.list()] == [m.id for m in direct.models.list()]
    e_direct = direct.embeddings.create(model="sim-embed", input=["a", "b"])
    e_via = via.embeddings.create(model="sim-embed", input=["a", "b"])
    assert e_via.model_dump() == e_direct.model_dump()
    legacy = httpx.post(f"{proxy}/v1/completions", json={"model": "m", "prompt": "hi"})
    assert (
        legacy.content
        == httpx.post(f"{simulator}/v1/completions", json={"model": "m", "prompt": "hi"}).content
    )


def test_control_headers_stay_in_the_proxy_and_auth_is_forwarded(
    proxy: str, sim_reset: str
) -> None:
    httpx.post(
        f"{proxy}/v1/chat/completions",
        json=CHAT,
        headers={
            "Authorization": "Bearer sk-caller",
            "X-Session-Id": "s1",
            "X-Compaction": "off",
            "X-Custom": "kept",
        },
    )
    seen = httpx.get(f"{sim_reset}/_sim/requests").json()[-1]["headers"]
    assert seen["authorization"] == "Bearer sk-caller"
    assert seen["x-custom"] == "kept"
    assert "x-session-id" not in seen
    assert "x-compaction" not in seen


def test_configured_api_key_replaces_the_callers(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset, upstream={"api_key": "sk-upstream"}))
    httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-x"})
    seen = httpx.get(f"{sim_reset}/_sim/requests").json()[-1]["headers"]
    assert seen["authorization"] == "Bearer sk-upstream"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"model": "m"}', None),
        (b'{"model": "m", "messages": []}', None),
        (b'{"model": "m", "messages": ["hi"]}', None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', None),
    ],
)
def test_bad_input_gets_an_openai_shaped_400(proxy: str, body: bytes, code: str | None) -> None:
    r = httpx.post(
        f"{proxy}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if code:
        assert error["code"] == code


def test_sdk_raises_bad_request_for_an_empty_history(proxy: str, sim_reset: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _sdk(proxy).chat.completions.create(model="m", messages=[])
    assert info.value.param == "messages"
    assert httpx.get(f"{sim_reset}/_sim/requests").json() == []


def test_oversized_body_gets_413(sim_reset: str, start_proxy: Callable[..., str]) -> None:
    url = start_proxy(proxy_settings(sim_reset, server={"max_body_bytes": 10_000}))
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 20_000}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{sim_reset}/_sim/requests").json() == []


def test_unreachable_upstream_is_a_502_not_a_stack_trace(
    start_proxy: Callable[..., str],
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    url = start_proxy(proxy_settings(dead))
    r = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unavailable"
    with pytest.raises(openai.InternalServerError):
        _sdk(url).chat.completions.create(**CHAT)  # type: ignore[call-overload]


def test_slow_upstream_is_a_504(sim_reset: str, start_proxy: Callable[..., str]) -> None:
    url = start_proxy(proxy_settings(sim_reset, upstream={"timeout_s": 0.3}))
    r = httpx.post(
        f"{url}/v1/chat/completions", json=CHAT, headers={"X-Sim-Latency-Ms": "2000"}, timeout=10
    )
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"


def test_health_and_readiness(proxy: str) -> None:
    assert httpx.get(f"{proxy}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{proxy}/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


def test_client_disconnect_cancels_the_upstream_stream(proxy: str, sim_reset: str) -> None:
    import time

    body = {**CHAT, "stream": True}
    headers = {"X-Sim-Chunk-Delay-Ms": "200"}
    with httpx.stream(
        "POST", f"{proxy}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        first = next(r.iter_raw())
        assert first.startswith(b"data: ")
    # Closed after the first chunk; the full stream would take seconds more.
    deadline = time.monotonic() + 30  # a stream left running ends as completed, not abandoned
    abandoned = 0
    while time.monotonic() < deadline and not abandoned:
        time.sleep(0.05)
        abandoned = httpx.get(f"{sim_reset}/_sim/stats").json()["streams_abandoned"]
    assert abandoned == 1


@pytest.fixture
def echo_upstream() -> Any:
    """An upstream that rejects every chat with a 300 KB error body, and shows what it got."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from tests.support.servers import run_server

    seen: list[dict[str, str]] = []

    async def chat(request: Request) -> Response:
        seen.append(dict(request.headers))
        huge = {"error": {"message": "bad request: " + "x" * 300_000, "type": "invalid"}}
        return JSONResponse(huge, status_code=400)

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with run_server(app) as url:
        yield url, seen


def test_large_upstream_error_bodies_arrive_whole(
    echo_upstream: Any, start_proxy: Callable[..., str]
) -> None:
    url, seen = echo_upstream
    proxy = start_proxy(proxy_settings(url))
    direct = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    r = httpx.post(f"{proxy}/v1/chat/completions", json=CHAT, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 400
    assert r.content == direct.content
    assert len(r.content) > 300_000
    # The proxy reads chat answers (overflow errors, usage), so it asks for them uncompressed.
    assert seen[-1]["accept-encoding"] == "identity"


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "assistant", "tool_calls": ["x"]}, "messages[0].tool_calls"),
        ({"role": "assistant", "tool_calls": {"id": "a"}}, "messages[0].tool_calls"),
        ({"role": "user", "content": 42}, "messages[0].content"),
    ],
)
def test_malformed_message_fields_are_a_400_not_a_500(
    proxy: str, sim_reset: str, message: dict[str, Any], param: str
) -> None:
    body = {"model": "m", "messages": [message, {"role": "user", "content": "hi"}]}
    r = httpx.post(f"{proxy}/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert httpx.get(f"{sim_reset}/_sim/requests").json() == []


def test_absurdly_nested_content_is_a_400_not_a_500(proxy: str) -> None:
    nested: Any = "deep"
    for _ in range(400):
        nested = [nested]
    body = {"model": "m", "messages": [{"role": "user", "content": nested, "x": nested}]}
    r = httpx.post(f"{proxy}/v1/chat/completions", json=body, headers={"X-Compaction": "force"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_upstream_cookies_are_never_replayed_to_other_callers(
    start_proxy: Callable[..., str],
) -> None:
    """One upstream session serves every tenant: it must not keep cookies."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from tests.support.servers import run_server

    cookies_seen: list[str | None] = []

    async def models(request: Request) -> Response:
        cookies_seen.append(request.headers.get("cookie"))
        response = JSONResponse({"object": "list", "data": []})
        response.set_cookie("upstream_session", "tenant-a-secret")
        return response

    app = Starlette(routes=[Route("/v1/models", models)])
    with run_server(app) as upstream_url:
        # A host name: aiohttp's default cookie jar ignores cookies from IP addresses.
        proxy = start_proxy(proxy_settings(upstream_url.replace("127.0.0.1", "localhost")))
        first = httpx.get(f"{proxy}/v1/models", headers={"Authorization": "Bearer sk-a"})
        assert "upstream_session" in first.headers["set-cookie"]  # relayed to its caller
        httpx.get(f"{proxy}/v1/models", headers={"Authorization": "Bearer sk-b"})
    assert cookies_seen == [None, None]


def test_large_uploads_on_other_endpoints_stream_through_unchanged(
    start_proxy: Callable[..., str],
) -> None:
    """Bodies of other endpoints (file uploads) are not held to the chat body limit."""
    import hashlib

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from tests.support.servers import run_server

    async def files(request: Request) -> Response:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            size += len(chunk)
        return JSONResponse(
            {"size": size, "sha256": digest.hexdigest(), "type": request.headers["content-type"]}
        )

    app = Starlette(routes=[Route("/v1/files", files, methods=["POST"])])
    payload = bytes(range(256)) * 20_000  # ~5 MB, over the proxy's 1 MB limit below
    with run_server(app) as upstream_url:
        proxy = start_proxy(proxy_settings(upstream_url, server={"max_body_bytes": 1_000_000}))

        def chunks() -> Any:
            for i in range(0, len(payload), 65_536):  # no content-length: chunked upload
                yield payload[i : i + 65_536]

        r = httpx.post(
            f"{proxy}/v1/files",
            content=chunks(),
            headers={"content-type": "application/octet-stream"},
            timeout=30,
        )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "type": "application/octet-stream",
    }
