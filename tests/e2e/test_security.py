"""Issue 13: the security suite. One caller must never reach another's data, steer the
proxy somewhere else, slip a second request past it, or find its secrets in a log.

A real proxy under uvicorn (proxy.serve.server's protocol), in front of the simulator or
of ``tests/support/faulty_upstream.py`` (raw asyncio, records every header it receives).
Requests whose bytes matter are written to raw sockets: httpx would normalise them.
``Elsewhere`` is a port the proxy must never connect to: it listens, never answers,
and counts the connections it got.

Each item of the issue's Security bullet and its tests (``test_`` left off; this module
unless another is named; ``[x]`` is a parametrized case):

| item | tested by |
| --- | --- |
| two keys, one session id: sessions API | two_tenants_with_one_session_id_never_meet; |
|   | test_compaction (40 turns each, facts recalled) |
| ... the admin API | two_tenants_... (metadata only; the admin key is no tenant) |
| ... what the upstream receives | two_tenants_... (summary calls too); test_compaction |
| ... learned windows, calibration | test_tenants; test_calibrate; test_learned_windows |
| admin key compared in constant time | the_admin_key_is_compared_in_constant_time (code) |
| wrong, short, long admin keys: 401 | wrong_admin_keys_are_refused; test_compaction |
| Host header ignored | no_request_reaches_another_host[host-*, forwarded-host] |
| absolute-form targets | no_request_reaches_another_host[absolute-form*, connect] |
| ``//host`` and ``/v1/../`` paths | no_request_reaches_another_host[*slash*, dot-*]; |
|   | test_path_safety |
| redirects relayed, not followed | upstream_redirects_are_relayed_not_followed, |
|   | upstream_redirects_in_summaries_are_not_followed |
| hop-by-hop headers, client to upstream | hop_by_hop_request_headers_stop_at_the_proxy; |
|   | test_passthrough_headers |
| hop-by-hop headers, upstream to client | hop_by_hop_response_headers_stop_at_the_proxy |
| Upgrade (h2c, websocket) | upgrade_requests_are_answered_as_http_1_1_and_closed, |
|   | upgrade_requests_with_a_body_are_refused |
| smuggling: CL + TE, duplicate CL, obs-fold | ambiguous_framing_is_refused_before_the_app |
| smuggling: CL shorter, longer than body | a_body_longer_than_its_length_is_the_next_request, |
|   | a_body_shorter_than_its_length_is_never_forwarded |
| Set-Cookie never replayed across tenants | the_upstream_client_keeps_no_cookie_jar (code), |
|   | upstream_cookies_never_reach_another_tenant; test_forwarding |
| logs: no content, keys, session values | debug_logs_carry_no_secrets (all stderr, DEBUG, |
|   | no forged lines); test_single_flight (compaction lines) |
| per-tenant bound: sessions | one_tenant_cannot_evict_another_tenants_sessions; |
|   | test_store_contract (MemoryStore, build_store) |
| per-tenant bound: scheduled compactions | one_tenants_schedules_do_not_block_another_tenants |
| per-tenant bound: session records (issue 20) | test_fairness (one_tenants_flood_...); |
|   | test_store_contract (..._another_tenants_sightings) |
| fair background summary slots (issue 20) | test_fairness (one_tenant_cannot_hold_...) |
| summary work bought: rate limit, back-off, calls | test_fairness (post_compact_..., |
|   | ..._backed_off_per_session, ..._at_most_max_summary_calls) |

Scheduled compactions (``POST /sessions/{id}/compact``) are written into the session's
own snapshot, so they are bounded by the tenant's sessions. The per-process hint that
lets a scheduled session skip the far-below fast path (``proxy.compaction.schedule``, at most
10,000) is shared: a tenant filling it delays another's schedule until its next turn
that reads the store, and never fails or blocks a request. The background
pre-compaction slots (``precompact_concurrency``) are shared fairly: a tenant under its
share preempts one over it (issue 20). The Redis store is bounded by TTL
(``store.ttl_s``, refreshed on use) and Redis's own ``maxmemory``, not per tenant.
"""

from __future__ import annotations

import ast
import inspect
import re
import signal
import socket
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from proxy.routes import admin_api
from proxy.upstream import client as upstream
from tests.support.faulty_upstream import FaultyUpstream, Seen, answer, completion, handoff, stream
from tests.support.servers import proxy_settings, run_proxy
from tests.support.starting import start_listening
from tests.support.timing import slack_s

pytestmark = pytest.mark.e2e

MODEL = "m-4k"
ADMIN_KEY = "adm-sec-4d1c9e"
KEY_A, KEY_B = "sk-tenant-alice-91f0", "sk-tenant-bob-7e22"
FILLER = "please keep careful notes about the project as we go along. " * 6  # ~100 tokens
HISTORY = 26  # turns of FILLER: a 4k window's compaction must summarize
# What RFC 9110 7.6.1 calls hop-by-hop, and what a Connection header names.
HOP_REQUEST = {
    "connection": "keep-alive, X-Hop-Named",
    "x-hop-named": "for-the-proxy-only",
    "keep-alive": "timeout=5",
    "te": "trailers",
    "trailer": "X-Checksum",
    "upgrade-insecure-requests": "1",  # not hop-by-hop: must arrive (the control)
    "proxy-authorization": "Basic cHJveHk6c2VjcmV0",
    "proxy-connection": "keep-alive",
}
HOP_NAMES = {name for name in HOP_REQUEST if name != "upgrade-insecure-requests"}


def settings_for(upstream_url: str, **sections: Any) -> Any:
    server = {"admin_key": ADMIN_KEY, **sections.pop("server", {})}
    return proxy_settings(
        upstream_url,
        upstream={"timeout_s": 3.0, "total_timeout_s": 6.0, **sections.pop("upstream", {})},
        models=[{"match": MODEL, "context_window": 4096, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "summary_timeout_s": 2.0, "precompact_ratio": None},
        server=server,
        **sections,
    )


def chat_body(text: str, *, history: int = 0, stream: bool = False) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(history):
        messages.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        messages.append({"role": "assistant", "content": f"Noted {turn}. {FILLER}"})
    messages.append({"role": "user", "content": text})
    return {"model": MODEL, "messages": messages, "stream": stream}


class Elsewhere:
    """A port the proxy must never connect to: it listens and never answers, so any
    connection waits in its backlog to be counted."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.authority = f"127.0.0.1:{self.port}"

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


def exchange(url: str, data: bytes, *, wait_s: float = 5.0) -> bytes:
    """Write ``data`` to a fresh connection; everything read until the proxy closes it
    (or ``wait_s`` without a byte)."""
    host, port = url.removeprefix("http://").split(":")
    out = b""
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def statuses(raw: bytes) -> list[int]:
    """The status of every response in ``raw``, in order."""
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]


def error_code(raw: bytes) -> str | None:
    body = raw.split(b"\r\n\r\n", 1)[1]
    code: str | None = orjson.loads(body)["error"]["code"]
    return code


def head(method: str, target: str, *lines: str, body: bytes = b"") -> bytes:
    """A raw request: ``lines`` are header lines (a Host line replaces the default one)."""
    host = [] if any(line.lower().startswith("host:") for line in lines) else ["Host: proxy.test"]
    fields = [*host, f"Authorization: Bearer {KEY_A}", *lines]
    if body and not any(line.lower().startswith(("content-length", "transfer")) for line in lines):
        fields.append(f"Content-Length: {len(body)}")
    return (
        f"{method} {target} HTTP/1.1\r\n".encode()
        + "\r\n".join(fields).encode()
        + (b"\r\n\r\n" + body)
    )


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyUpstream]:
    with FaultyUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def proxy(faulty: FaultyUpstream) -> Iterator[str]:
    with run_proxy(settings_for(faulty.url)) as url:
        yield url


@pytest.fixture
def up(faulty: FaultyUpstream) -> Iterator[FaultyUpstream]:
    """The module's upstream, answering normally again after each test."""
    faulty.seen.clear()
    yield faulty
    faulty.release()
    faulty.chat, faulty.summary = answer(), answer(body=completion(handoff("none")))


@pytest.fixture
def elsewhere() -> Iterator[Elsewhere]:
    target = Elsewhere()
    try:
        yield target
    finally:
        target.close()


# --- tenants ----------------------------------------------------------------------------


def test_two_tenants_with_one_session_id_never_meet(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings_for(sim_reset))

    def compact(key: str, owner: str) -> httpx.Response:
        history = [
            {"role": "user", "content": f"FACT owner={owner}"},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": f"more from {owner}"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "compact please"},
        ]
        return httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL, "messages": history},
            headers={
                "Authorization": f"Bearer {key}",
                "X-Session-Id": "shared",
                "X-Compaction": "force",
            },
        )

    def as_tenant(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    assert compact(KEY_A, "alice").headers["x-compaction-status"] == "compacted"
    assert compact(KEY_B, "bob").headers["x-compaction-status"] == "compacted"
    # The upstream: each tenant's calls, its summary calls included, carry its own data only.
    recorded = httpx.get(f"{sim_reset}/_sim/requests").json()
    assert len(recorded) == 4  # a summary and a chat per tenant
    for request in recorded:
        body = orjson.dumps(request["body"])
        mine, theirs = (
            (b"owner=alice", b"owner=bob")
            if request["headers"]["authorization"] == f"Bearer {KEY_A}"
            else (b"owner=bob", b"owner=alice")
        )
        assert theirs not in body
        assert mine in body or b"owner" not in body
    # The sessions API: each reads its own; no one else reads, schedules or deletes it.
    alice = httpx.get(f"{url}/sessions/shared", headers=as_tenant(KEY_A)).json()
    bob = httpx.get(f"{url}/sessions/shared", headers=as_tenant(KEY_B)).json()
    assert "owner=alice" in alice["summary"]
    assert "owner=bob" not in alice["summary"]
    assert "owner=bob" in bob["summary"]
    assert "owner=alice" not in bob["summary"]
    for who in ("sk-mallory", ADMIN_KEY):  # the admin key is no master key here
        stranger = as_tenant(who)
        assert httpx.get(f"{url}/sessions/shared", headers=stranger).status_code == 404
        assert httpx.post(f"{url}/sessions/shared/compact", headers=stranger).status_code == 404
        assert httpx.delete(f"{url}/sessions/shared", headers=stranger).status_code == 404
    # The admin API: metadata of both, never a summary, a key or the session id.
    listing = httpx.get(f"{url}/admin/sessions", headers=as_tenant(ADMIN_KEY))
    assert listing.status_code == 200
    data = listing.json()["data"]
    assert len(data) == 2
    assert len({entry["tenant"] for entry in data}) == 2
    for secret in ("owner=", KEY_A, KEY_B, '"shared"', "FACT"):
        assert secret not in listing.text
    for key in (KEY_A, KEY_B):
        assert httpx.get(f"{url}/admin/sessions", headers=as_tenant(key)).status_code == 401
    assert httpx.delete(f"{url}/sessions/shared", headers=as_tenant(KEY_B)).status_code == 200
    after = httpx.get(f"{url}/sessions/shared", headers=as_tenant(KEY_A))
    assert after.status_code == 200
    assert after.json()["summary"] == alice["summary"]


_SCANS = ("startswith", "endswith", "find", "index", "removeprefix")


def test_the_admin_key_is_compared_in_constant_time() -> None:
    """Code inspection: the one comparison of a given key with ``admin_key`` is
    ``compare_digest``, and no ``==``, ``!=``, ``in`` or ``startswith`` touches either."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(admin_api._authorize)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    digests = [
        c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "compare_digest"
    ]
    assert len(digests) == 1
    assert isinstance(digests[0].func, ast.Attribute)
    assert isinstance(digests[0].func.value, ast.Name)
    assert digests[0].func.value.id in ("hmac", "secrets")
    compared = {ast.unparse(arg) for arg in digests[0].args}
    assert any("admin_key" in arg for arg in compared)
    assert any("given" in arg for arg in compared)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert not names & {"given", "admin_key"}, ast.unparse(node)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in _SCANS:
            assert "admin_key" not in ast.unparse(node), ast.unparse(node)


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        f"Bearer {ADMIN_KEY[:-1]}",  # a prefix
        f"Bearer {ADMIN_KEY[1:]}",  # a suffix
        f"Bearer {ADMIN_KEY}x",  # longer
        f"Bearer {ADMIN_KEY[:-1]}X",  # same length, last byte differs
        f"Bearer {ADMIN_KEY.upper()}",
        f"Basic {ADMIN_KEY}",
        f"Bearer {ADMIN_KEY} {ADMIN_KEY}",
        "Bearer " + "a" * 8000,
        f"Bearer {KEY_A}",
    ],
    ids=lambda value: "none" if value is None else (value[:24] or "empty"),
)
def test_wrong_admin_keys_are_refused(proxy: str, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    refused = httpx.get(f"{proxy}/admin/sessions", headers=headers)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] in ("invalid_admin_key", "missing_api_key")
    # The key in another credential header is not the admin key either.
    assert httpx.get(f"{proxy}/admin/sessions", headers={"api-key": ADMIN_KEY}).status_code == 401
    ok = httpx.get(f"{proxy}/admin/sessions", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert ok.status_code == 200


# --- no client-controlled upstream -------------------------------------------------------

CHAT = orjson.dumps(chat_body("hello"))
# name: (request, with {evil} for the other host; the answer's status; the path the
# configured upstream must receive it on, or None: it receives nothing)
TARGETS: dict[str, tuple[Callable[[str], bytes], int, str | None]] = {
    "host-passthrough": (
        lambda evil: head("GET", "/v1/models", f"Host: {evil}", "Connection: close"),
        200,
        "/v1/models",
    ),
    "host-chat": (
        lambda evil: head(
            "POST", "/v1/chat/completions", f"Host: {evil}", "Connection: close", body=CHAT
        ),
        200,
        "/v1/chat/completions",
    ),
    "forwarded-host": (
        lambda evil: head(
            "GET",
            "/v1/models",
            f"X-Forwarded-Host: {evil}",
            "Forwarded: host=evil",
            "Connection: close",
        ),
        200,
        "/v1/models",
    ),
    "absolute-form": (
        lambda evil: head("GET", f"http://{evil}/v1/models", "Connection: close"),
        200,
        "/v1/models",
    ),
    "absolute-form-https": (
        lambda evil: head("GET", f"https://{evil}/v1/models", "Connection: close"),
        200,
        "/v1/models",
    ),
    "absolute-form-chat": (
        lambda evil: head(
            "POST", f"http://{evil}/v1/chat/completions", "Connection: close", body=CHAT
        ),
        200,
        "/v1/chat/completions",
    ),
    "absolute-form-userinfo": (
        lambda evil: head("GET", f"http://user@{evil}/v1/models", "Connection: close"),
        200,
        "/v1/models",
    ),
    "connect": (lambda evil: head("CONNECT", evil, "Connection: close"), 400, None),
    "double-slash": (
        lambda evil: head("GET", f"//{evil}/v1/models", "Connection: close"),
        404,
        None,
    ),
    "v1-double-slash": (  # a path on the configured upstream, never a host
        lambda evil: head("GET", f"/v1//{evil}/models", "Connection: close"),
        200,
        "/v1//{evil}/models",
    ),
    "v1-at-sign": (
        lambda evil: head("GET", f"/v1/@{evil}/models", "Connection: close"),
        200,
        "/v1/@{evil}/models",
    ),
    "dot-segments": (
        lambda evil: head("GET", "/v1/../v1/models", "Connection: close"),
        400,
        None,
    ),
    "dot-segments-encoded": (
        lambda evil: head("GET", "/v1/%2e%2e/%2e%2e/admin", "Connection: close"),
        400,
        None,
    ),
    "dot-segments-to-host": (
        lambda evil: head("GET", f"/v1/../../{evil}/v1/models", "Connection: close"),
        400,
        None,
    ),
    "asterisk": (lambda evil: head("OPTIONS", "*", "Connection: close"), 404, None),
}


@pytest.mark.parametrize("case", TARGETS)
def test_no_request_reaches_another_host(
    proxy: str, up: FaultyUpstream, elsewhere: Elsewhere, case: str
) -> None:
    request, status, path = TARGETS[case]
    raw = exchange(proxy, request(elsewhere.authority))
    assert statuses(raw)[:1] == [status], raw[:300]
    if path is None:
        assert up.seen == []
    else:
        assert [(s.path, s.headers["host"]) for s in up.seen] == [
            (path.format(evil=elsewhere.authority), up.url.removeprefix("http://"))
        ]
    assert elsewhere.connections() == 0


REDIRECTS = [
    ("GET", "/v1/models", None, 302),
    ("POST", "/v1/files", b'{"purpose": "batch"}', 307),
    ("POST", "/v1/chat/completions", CHAT, 307),
    ("POST", "/v1/chat/completions", orjson.dumps(chat_body("hi", stream=True)), 308),
    ("POST", "/v1/chat/completions", CHAT, 301),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), REDIRECTS)
def test_upstream_redirects_are_relayed_not_followed(
    proxy: str,
    up: FaultyUpstream,
    elsewhere: Elsewhere,
    method: str,
    path: str,
    body: bytes | None,
    status: int,
) -> None:
    location = f"http://{elsewhere.authority}/v1/models"
    up.chat = answer(status, b"{}", {"location": location})
    r = httpx.request(
        method, f"{proxy}{path}", content=body, headers={"Authorization": f"Bearer {KEY_A}"}
    )
    assert r.status_code == status
    assert r.headers["location"] == location
    assert len(up.seen) == 1
    assert elsewhere.connections() == 0


def test_upstream_redirects_in_summaries_are_not_followed(
    proxy: str, up: FaultyUpstream, elsewhere: Elsewhere
) -> None:
    up.summary = answer(307, b"{}", {"location": f"http://{elsewhere.authority}/v1/x"})
    r = httpx.post(
        f"{proxy}/v1/chat/completions",
        json=chat_body("now", history=HISTORY),
        headers={"Authorization": f"Bearer {KEY_A}", "X-Session-Id": "redirected"},
    )
    assert r.status_code == 200
    assert r.headers["x-compaction-status"] == "trimmed"  # no summary: the turn still served
    assert len(up.requests(summaries=True)) == 1
    assert elsewhere.connections() == 0


# --- hop-by-hop headers --------------------------------------------------------------------


def _hop_free(seen: Seen) -> None:
    names = set(seen.headers)
    assert not names & HOP_NAMES, (seen.path, names & HOP_NAMES)


@pytest.mark.parametrize("route", ["chat", "chat-with-summary", "passthrough"])
def test_hop_by_hop_request_headers_stop_at_the_proxy(
    proxy: str, up: FaultyUpstream, route: str
) -> None:
    lines = [f"{name}: {value}" for name, value in HOP_REQUEST.items()]
    if route == "passthrough":
        request = head("POST", "/v1/embeddings", *lines, body=b'{"input": "x"}')
    else:
        history = HISTORY if route == "chat-with-summary" else 0
        body = orjson.dumps(chat_body("hi", history=history))
        request = head("POST", "/v1/chat/completions", *lines, "X-Session-Id: hop", body=body)
    raw = exchange(proxy, request.replace(b"keep-alive, X-Hop", b"close, X-Hop"))
    assert statuses(raw) == [200]
    assert len(up.requests()) == 1
    assert bool(up.requests(summaries=True)) == (route == "chat-with-summary")
    for seen in up.seen:
        _hop_free(seen)
    assert up.requests()[0].headers["upgrade-insecure-requests"] == "1"


HOP_RESPONSE = {
    "connection": "keep-alive, X-Hop-Secret",
    "x-hop-secret": "upstream-internal",
    "keep-alive": "timeout=5, max=100",
    "proxy-authenticate": 'Basic realm="upstream"',
    "proxy-connection": "keep-alive",
    "upgrade": "h2c",
    "trailer": "X-Checksum",
    "te": "trailers",
    "x-request-id": "req-1",  # end to end: arrives as X-Upstream-Request-Id (the control)
}


@pytest.mark.parametrize("route", ["chat", "chat-stream", "passthrough"])
def test_hop_by_hop_response_headers_stop_at_the_proxy(
    proxy: str, up: FaultyUpstream, route: str
) -> None:
    """Found by this suite: the names an upstream's Connection header lists were relayed."""
    if route == "chat-stream":
        up.chat = stream(b'data: {"choices": []}\n\n', b"data: [DONE]\n\n", headers=HOP_RESPONSE)
    else:
        up.chat = answer(headers=HOP_RESPONSE)
    body = chat_body("hi", stream=route == "chat-stream")
    path = "/v1/embeddings" if route == "passthrough" else "/v1/chat/completions"
    r = httpx.post(f"{proxy}{path}", json=body, headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200
    received = {name.lower() for name, _ in r.headers.multi_items()}
    hop = {name for name in HOP_RESPONSE if name != "x-request-id"}
    assert not received & hop, received & hop
    assert r.headers["x-upstream-request-id"] == "req-1"


@pytest.mark.parametrize(
    "upgrade",
    [
        ["Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQAAP__"],
        [
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
        ],
    ],
    ids=["h2c", "websocket"],
)
def test_upgrade_requests_are_answered_as_http_1_1_and_closed(
    proxy: str, up: FaultyUpstream, upgrade: list[str]
) -> None:
    """The proxy speaks HTTP/1.1 only; what follows an Upgrade on the connection is
    never parsed, so the connection closes after the answer (a second request on it
    is not served, nor smuggled)."""
    second = head("GET", "/v1/smuggled")
    bound = slack_s(proxy, 3.0)  # the keep-alive timeout is 75 s
    started = time.monotonic()
    raw = exchange(proxy, head("GET", "/v1/models", *upgrade) + second, wait_s=bound + 5)
    assert statuses(raw) == [200]
    assert b"connection: close" in raw.lower()
    assert time.monotonic() - started < bound  # closed at once, not at a keep-alive timeout
    assert [s.path for s in up.seen] == ["/v1/models"]
    for name in ("upgrade", "http2-settings", "connection"):
        assert name not in up.seen[0].headers


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
@pytest.mark.parametrize("upgrade", ["h2c", "websocket"])
def test_upgrade_requests_with_a_body_are_refused(
    proxy: str, up: FaultyUpstream, path: str, upgrade: str
) -> None:
    """Found by this suite: the parser ends an Upgrade request at its head, so its body
    reached the upstream empty (h2c), or the connection went to a WebSocket protocol that
    no server limit watched, held for minutes by one request (websocket)."""
    lines = ["Connection: Upgrade", f"Upgrade: {upgrade}"]
    if upgrade == "websocket":
        lines += ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    bound = slack_s(proxy, 3.0)
    started = time.monotonic()
    smuggled = head("POST", path, *lines, body=CHAT) + head("GET", "/v1/smuggled")
    raw = exchange(proxy, smuggled, wait_s=bound + 5)
    assert time.monotonic() - started < bound
    assert statuses(raw) == [400], raw[:300]
    assert error_code(raw) == "invalid_http"
    assert up.seen == []


# --- request smuggling ---------------------------------------------------------------------

SMUGGLED = b"GET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
FRAMING = {
    "cl-and-te": (["Content-Length: 4", "Transfer-Encoding: chunked"], b"0\r\n\r\n"),
    "te-and-cl": (["Transfer-Encoding: chunked", "Content-Length: 4"], b"0\r\n\r\n"),
    "duplicate-cl": (["Content-Length: 2", "Content-Length: 40"], b"{}"),
    "duplicate-cl-equal": (["Content-Length: 2", "Content-Length: 2"], b"{}"),
    "cl-list": (["Content-Length: 2, 2"], b"{}"),
    "cl-sign": (["Content-Length: +2"], b"{}"),
    "cl-hex": (["Content-Length: 0x2"], b"{}"),
    "te-not-chunked-last": (["Transfer-Encoding: chunked, identity"], b"0\r\n\r\n"),
    "te-unknown-with-cl": (["Transfer-Encoding: xchunked", "Content-Length: 2"], b"{}"),
    "te-duplicate": (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], b"0\r\n\r\n"),
    "te-space-before-colon": (["Transfer-Encoding : chunked"], b"0\r\n\r\n"),
    "obs-fold": (["X-Folded: a", " b", "Content-Length: 2"], b"{}"),
    "obs-fold-te": (["Content-Length: 2", "Transfer-Encoding:", " chunked"], b"0\r\n\r\n"),
    "bare-lf": (["X-A: 1\nContent-Length: 2"], b"{}"),
    "nul-in-header": (["X-A: a\x00b", "Content-Length: 2"], b"{}"),
    "chunk-size-overflow": (
        ["Transfer-Encoding: chunked"],
        b"fffffffffffffffff1\r\n{}\r\n0\r\n\r\n",
    ),
    "chunk-ext-bare-lf": (["Transfer-Encoding: chunked"], b"2;x\n\r\n{}\r\n0\r\n\r\n"),
}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/embeddings"])
@pytest.mark.parametrize("case", FRAMING)
def test_ambiguous_framing_is_refused_before_the_app(
    proxy: str, up: FaultyUpstream, case: str, route: str
) -> None:
    """Any request whose length two parsers could read differently gets a 400 and a
    closed connection: nothing of it, and nothing after it, reaches the upstream."""
    lines, body = FRAMING[case]
    raw = exchange(proxy, head("POST", route, *lines) + body + SMUGGLED)
    assert statuses(raw) == [400], raw[:300]
    assert error_code(raw) == "invalid_http"
    time.sleep(0.1)  # an upstream call would be under way by now
    assert up.seen == []


def test_a_body_longer_than_its_length_is_the_next_request(proxy: str, up: FaultyUpstream) -> None:
    """Bytes past Content-Length are the next request on the connection, answered as
    such; each goes upstream with its own framing, never spliced into the other."""
    first = head("POST", "/v1/embeddings", "Content-Length: 2", body=b"{}")
    second = head("POST", "/v1/embeddings", "Connection: close", body=b'{"input": "x"}')
    raw = exchange(proxy, first + second)
    assert statuses(raw) == [200, 200]
    assert [(s.path, s.body) for s in up.seen] == [
        ("/v1/embeddings", b"{}"),
        ("/v1/embeddings", b'{"input": "x"}'),
    ]
    assert [s.headers["content-length"] for s in up.seen] == ["2", "14"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_body_shorter_than_its_length_is_never_forwarded(
    proxy: str, up: FaultyUpstream, route: str
) -> None:
    """A client that declares more than it sends and leaves: the part that came is not
    sent upstream as if it were the request."""
    host, port = proxy.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        sock.sendall(head("POST", route, "Content-Length: 100", body=CHAT[:40]))
        time.sleep(0.3)
        sock.shutdown(socket.SHUT_WR)
        with suppress(TimeoutError, ConnectionResetError):
            while sock.recv(65536):
                pass
    time.sleep(0.3)
    complete = [s for s in up.seen if s.path == route and len(s.body) == 100]
    assert complete == []
    assert all(len(s.body) != 40 for s in up.seen)


# --- cookies -------------------------------------------------------------------------------


def test_the_upstream_client_keeps_no_cookie_jar() -> None:
    """Code inspection: the one session every tenant shares is built with aiohttp's
    ``DummyCookieJar`` (aiohttp's default jar stores and replays cookies)."""
    source = inspect.getsource(upstream.UpstreamClient.__init__)
    assert re.search(r"cookie_jar=aiohttp\.DummyCookieJar\(\)", source)


def test_upstream_cookies_never_reach_another_tenant() -> None:
    """Set-Cookie on tenant A's chat and summary answers: relayed to A, never sent on
    anyone's later upstream call, B's chat and summary included."""
    cookie = {"set-cookie": "upstream_session=alice-only; Path=/"}
    with FaultyUpstream() as faulty:
        faulty.chat = answer(headers=cookie)
        faulty.summary = answer(body=completion(handoff("none")), headers=cookie)
        # A host name: aiohttp's default jar ignores cookies from IP addresses.
        settings = settings_for(faulty.url.replace("127.0.0.1", "localhost"))
        with run_proxy(settings) as url:  # stops before the upstream does
            for key in (KEY_A, KEY_B, KEY_A):
                auth = {"Authorization": f"Bearer {key}"}
                r = httpx.post(
                    f"{url}/v1/chat/completions",
                    json=chat_body("hi", history=HISTORY),
                    headers={**auth, "X-Session-Id": "cookies"},
                )
                assert r.status_code == 200
                assert r.headers["set-cookie"].startswith("upstream_session=alice-only")
                assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
        assert len(faulty.requests(summaries=True)) >= 2
        assert all("cookie" not in seen.headers for seen in faulty.seen)


# --- logs ----------------------------------------------------------------------------------

LOG_SECRETS = {
    "content": "vault-zq7f00d-content",
    "key": "sk-log-alice-5e1d0c93",
    "azure key": "azurekey-b71c4400",
    "anthropic key": "sk-ant-x-c2e9a1f5",
    "session": "ticket-session-8d3f2a",
    "admin key": "adm-log-be51c0de",
    "upstream key": "sk-proxy-own-7a7a7a",
}


@pytest.fixture
def debug_proxy(sim_reset: str, tmp_path: Path) -> Iterator[tuple[str, Path, Any]]:
    """``compaction-proxy serve`` as its own process at DEBUG, stderr to a file."""
    config = {
        "upstream": {"base_url": f"{sim_reset}/v1"},
        "server": {"log_level": "debug", "admin_key": LOG_SECRETS["admin key"]},
        "models": [{"match": "sim-4k", "context_window": 4096, "max_output_tokens": 256}],
        "compaction": {"summary_max_tokens": 400, "precompact_ratio": 0.6},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    stderr = tmp_path / "stderr.log"
    cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path)]
    process, port = start_listening(
        lambda port: [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        stderr,
        "/healthz",
        "the proxy",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, stderr, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def test_debug_logs_carry_no_secrets(debug_proxy: tuple[str, Path, Any], sim_reset: str) -> None:
    """Every line the proxy writes at DEBUG, from start to SIGTERM, over chats that
    compact (inline and in the background), streams, a client that leaves mid-stream,
    overflow recovery, upstream errors, the sessions and admin APIs, refused keys, bad
    bodies, unparsable HTTP and oversized headers, each carrying planted secrets: not one
    holds message content, a key (or its last 8 characters) or a session header value, and
    no client text starts a line of its own."""
    url, stderr, process = debug_proxy
    s = LOG_SECRETS
    keyed = {"Authorization": f"Bearer {s['key']}", "X-Session-Id": s["session"]}
    sim = {"X-Sim-Context-Window": "4096"}
    history: list[dict[str, Any]] = [{"role": "system", "content": f"Guard {s['content']}."}]
    with httpx.Client(base_url=url, timeout=30) as client:
        for turn in range(36):
            history.append({"role": "user", "content": f"Turn {turn} {s['content']}: {FILLER}"})
            r = client.post(
                "/v1/chat/completions",
                json={"model": "sim-4k", "messages": history, "stream": turn % 3 == 0},
                headers={**keyed, **sim},
            )
            assert r.status_code == 200
            history.append({"role": "assistant", "content": f"Noted {turn}."})
        assert client.get(f"/sessions/{s['session']}", headers=keyed).json()["version"] >= 1
        for headers in (
            {"api-key": s["azure key"], "X-Compaction": "force"},
            {"x-api-key": s["anthropic key"], "X-Compaction": "force"},
            {**keyed, "X-Sim-Context-Window": "900"},  # overflow, recovered
            {**keyed, "X-Sim-Fail": "500"},
            {**keyed, "X-Sim-Fail": "429"},
            {**keyed, "X-Compaction": "off"},
        ):
            client.post(
                "/v1/chat/completions",
                json={"model": "sim-4k", "messages": history},
                headers={"X-Session-Id": s["session"], **sim, **headers},
            )
        for method in ("GET", "POST", "DELETE"):
            path = f"/sessions/{s['session']}" + ("/compact" if method == "POST" else "")
            client.request(method, path, headers=keyed)
            client.request(method, path, headers={"Authorization": f"Bearer {s['azure key']}"})
        for key in (s["admin key"], s["admin key"][:-1], s["key"]):
            client.get("/admin/sessions", headers={"Authorization": f"Bearer {key}"})
        client.get("/v1/models", headers=keyed)
        client.post("/v1/chat/completions", content=f'{{"x": "{s["content"]}', headers=keyed)
        client.post(
            "/v1/chat/completions",
            json={"model": "sim-4k", "messages": [{"role": s["content"], "content": 1}]},
            headers=keyed,
        )
        # A model name is the client's text, and is logged with a learned window.
        client.post(
            "/v1/chat/completions",
            json={
                "model": "sim-4k\n2026-01-01 00:00:00,000 ERROR forged line",
                "messages": history,
            },
            headers={**keyed, "X-Sim-Context-Window": "900"},
        )
    raws = [
        head("GET", "/v1/models", f"X-Bad\x01: {s['key']}"),
        head("GET", f"/v1/{s['content']}/..", f"X-Session-Id: {s['session']}"),
        head("GET", "/v1/models", f"X-Huge: {s['key']}" + "a" * 70_000),
        head("POST", "/v1/models", "Connection: Upgrade", "Upgrade: h2c", body=s["key"].encode()),
    ]
    for raw in raws:
        exchange(url, raw.replace(KEY_A.encode(), s["key"].encode()), wait_s=2)
    # A client that leaves mid-stream.
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps({"model": "sim-4k", "messages": history, "stream": True})
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            head(
                "POST",
                "/v1/chat/completions",
                f"X-Session-Id: {s['session']}",
                "X-Sim-Chunk-Delay-Ms: 200",
                body=body,
            ).replace(KEY_A.encode(), s["key"].encode())
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0

    lines = stderr.read_text(errors="replace").splitlines()
    # JSON lines (the default): the compaction line carries its fields as keys.
    assert any('"msg":"compaction"' in line and '"session"' in line for line in lines), (
        "the proxy logged its work"
    )
    assert any("retrying once" in line for line in lines), "the overflow was recovered"
    assert any("learned context window for model" in line for line in lines)
    assert not any(line.startswith("2026-01-01") for line in lines), "a client forged a log line"
    for line in lines:
        for what, secret in s.items():
            assert secret not in line, f"{what} in a log line: {line}"
            assert secret[-8:] not in line, f"{what}'s tail in a log line: {line}"


# --- per-tenant bounds ---------------------------------------------------------------------


def _force(url: str, key: str, session: str) -> httpx.Response:
    history = [
        {"role": "user", "content": f"FACT where={session}"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "compact please"},
    ]
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": history},
        headers={
            "Authorization": f"Bearer {key}",
            "X-Session-Id": session,
            "X-Compaction": "force",
        },
    )


def test_one_tenant_cannot_evict_another_tenants_sessions(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Found by this suite: the embedded store dropped its least recently used session
    when full, whoever's it was, so one caller making sessions emptied it of everyone
    else's. Now a tenant past ``store.max_sessions_per_tenant`` loses its own."""
    url = start_proxy(
        settings_for(sim_reset, store={"max_sessions": 6, "max_sessions_per_tenant": 3})
    )
    assert _force(url, KEY_B, "bob-1").headers["x-compaction-status"] == "compacted"
    for i in range(12):
        assert _force(url, KEY_A, f"flood-{i}").headers["x-compaction-status"] == "compacted"

    def held(key: str, session: str) -> bool:
        r = httpx.get(f"{url}/sessions/{session}", headers={"Authorization": f"Bearer {key}"})
        return r.status_code == 200 and r.json()["version"] > 0  # a snapshot, not a sighting

    assert held(KEY_B, "bob-1")
    assert [i for i in range(12) if held(KEY_A, f"flood-{i}")] == [9, 10, 11]


def test_one_tenants_schedules_do_not_block_another_tenants(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Scheduling compactions for all of one's sessions, over and over, neither refuses
    another tenant's schedule nor stops its next turn compacting."""
    url = start_proxy(settings_for(sim_reset))
    for i in range(5):
        _force(url, KEY_A, f"a-{i}")
    _force(url, KEY_B, "b")
    for round_ in range(4):
        for i in range(5):
            r = httpx.post(
                f"{url}/sessions/a-{i}/compact", headers={"Authorization": f"Bearer {KEY_A}"}
            )
            # Again within force_interval_s: refused (issue 20 item 12), the first taken.
            assert r.status_code == (202 if round_ == 0 else 429)
    r = httpx.post(f"{url}/sessions/b/compact", headers={"Authorization": f"Bearer {KEY_B}"})
    assert r.status_code == 202
    history = [
        {"role": "user", "content": "FACT where=b"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "compact please"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "next"},
    ]
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": history},
        headers={"Authorization": f"Bearer {KEY_B}", "X-Session-Id": "b"},
    )
    assert r.headers["x-compaction-status"] == "compacted"
