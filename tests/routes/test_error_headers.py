"""The proxy's own errors on chat routes say what the upstream saw, as its answers do.

A request the proxy refuses before sending anything upstream answers
``X-Compaction-Status: rejected``, version 0, 0 tokens, and the model's window
once the model is known; an error after a view was sent (the upstream
unreachable) carries that view's headers. The real app in-process, its
middleware included; the upstream is a closed port, so nothing is ever answered
by anyone but the proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.config import Settings
from tests.support.servers import free_port

WINDOW = 1024
KEY = {"Authorization": "Bearer sk-client"}
CHAT = "/v1/chat/completions"


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = Settings(
        upstream={"base_url": f"http://127.0.0.1:{free_port()}/v1", "api_key": "sk-upstream"},
        server={"max_body_bytes": 64 * 1024, "require_client_key": True},
        models=[{"match": "sim-*", "context_window": WINDOW, "max_output_tokens": 128}],
    )
    with TestClient(create_app(settings)) as client:
        yield client


def _chat(content: str, model: str = "sim-small") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}]})


def _compaction(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith(("x-compaction", "x-context"))}


REJECTED = {"x-compaction-status": "rejected", "x-compaction-version": "0", "x-context-tokens": "0"}
# (path, body, extra headers, status, whether the model is known when it is refused)
REFUSED = {
    "bad json": (CHAT, b'{"model": "sim-small", "messages": [', {}, 400, False),
    "no messages": (CHAT, b'{"model": "sim-small"}', {}, 400, False),
    "no credential": (CHAT, _chat("hi"), {"Authorization": ""}, 401, False),
    "body too large": (CHAT, _chat("word " * 20_000), {}, 413, False),
    "unknown encoding": (CHAT, _chat("hi"), {"Content-Encoding": "br-x"}, 415, False),
    "message over the window": (CHAT, _chat("word " * 4 * WINDOW), {}, 400, True),
    "session name too long": (CHAT, _chat("hi"), {"X-Session-Id": "s" * 1025}, 400, True),
    "responses: bad json": ("/v1/responses", b"{", {}, 400, False),
    "responses: an item not an object": (
        "/v1/responses",
        b'{"model": "sim-small", "input": [3]}',
        {},
        400,
        False,
    ),
    "responses: session name too long": (
        "/v1/responses",
        b'{"model": "sim-small", "input": "hi"}',
        {"X-Session-Id": "s" * 1025},
        400,
        True,
    ),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_a_request_the_proxy_refuses_says_rejected(
    client: TestClient, case: tuple[str, bytes, dict[str, str], int, bool]
) -> None:
    path, body, extra, status, model_known = case
    headers = {**KEY, "Content-Type": "application/json", **extra}
    answer = client.post(path, content=body, headers=headers)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["message"]  # OpenAI's error shape
    assert answer.headers["x-request-id"]
    expected = {**REJECTED, "x-context-window": str(WINDOW)} if model_known else REJECTED
    assert _compaction(answer.headers) == expected


def test_an_error_after_the_view_went_out_carries_that_view(client: TestClient) -> None:
    answer = client.post(CHAT, content=_chat("hello"), headers=KEY)  # the upstream is down
    assert answer.status_code == 502
    headers = _compaction(answer.headers)
    assert headers["x-compaction-status"] == "passthrough"
    assert headers["x-context-window"] == str(WINDOW)
    assert int(headers["x-context-tokens"]) > 0


def test_errors_on_other_routes_carry_no_compaction_headers(client: TestClient) -> None:
    answer = client.get("/sessions/nobody", headers=KEY)
    assert answer.status_code == 404
    assert _compaction(answer.headers) == {}
    answer = client.get("/v1/models")  # no credential: the passthrough's own 401
    assert answer.status_code == 401
    assert _compaction(answer.headers) == {}
