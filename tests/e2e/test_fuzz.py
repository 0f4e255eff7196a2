"""Issue 13: bad input, case by case, and a request fuzzer, against one running proxy.

One real proxy under uvicorn (proxy.serve.server's protocol and limits) in front of the
simulator, with a 2k window so bodies of a few KB are compacted, and a body limit
of 1 MiB (``tests/support/fuzzing.py`` has its configuration, the strategies and the
verdict). Requests go as raw bytes on a socket: what no HTTP client would send.

Decisions the table pins down:

- A chat body with a Content-Encoding (gzip, br, anything but identity) gets a 415
  ``unsupported_content_encoding``: the proxy reads and may rewrite the body, so it
  does not accept one it would have to inflate (passthrough routes forward such
  bodies untouched, header included).
- Duplicate JSON keys: the last one wins, as in orjson, Python's json, Go and
  JavaScript; when the proxy rewrites the body, the upstream gets one key.
- Bytes that are not UTF-8, lone surrogate escapes, raw control characters and
  nesting orjson does not parse (1,024 levels) or write back (255) are the client's
  400 ``invalid_json``; an escaped NUL is text, forwarded as is.

Covered elsewhere: 10,000 messages (test_scale), more than ``server.max_messages``
(test_bad_input, test_scale), headers too long or too many (test_client_limits:
431), a body that stalls or trickles (test_client_limits), odd values of each
field the proxy reads (test_bad_input's own fuzzer).
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.support import fuzzing
from tests.support.fuzzing import MAX_BODY, MODEL, history, request_bytes
from tests.support.servers import proxy_settings, run_proxy
from tests.support.timing import slack_s

pytestmark = pytest.mark.e2e

# CI's bound; bench/fuzz.py runs more. About 20 s on the 2-core development machine.
FUZZ_EXAMPLES = 2000
HEALTH_EVERY = 100  # requests between two /healthz checks
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
JSON = [(b"Content-Type", b"application/json"), (b"Connection", b"close")]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def address(simulator: str) -> Iterator[tuple[str, int]]:
    with run_proxy(proxy_settings(simulator, **fuzzing.PROXY_CONFIG)) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def post(
    address: tuple[str, int],
    body: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
    *,
    chunked: bool = False,
) -> fuzzing.Answer:
    answer = fuzzing.exchange(
        address, request_bytes("POST", CHAT, [*JSON, *(extra or [])], body, chunked)
    )
    fuzzing.check(answer)
    assert fuzzing.exchange(address, HEALTH, 5).status == 200
    return answer


def chat(messages: list[Any], **extra: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": messages, **extra})


def error_of(answer: fuzzing.Answer) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(answer.body)["error"]
    return error


def forwarded(sim: str) -> list[dict[str, Any]]:
    """The chats the simulator got since the test began (not the summary calls)."""
    return [
        r["body"]
        for r in httpx.get(f"{sim}/_sim/requests").json()
        if r["headers"].get("x-compaction-purpose") != "summarize"
    ]


HI = [{"role": "user", "content": "hi"}]
LONG = history(12)  # over the 2k window's trigger: the request is compacted
DEEP = 100_000


def _nested_in_content(depth: int) -> bytes:
    return chat([{"role": "user", "content": "X"}]).replace(b'"X"', b"[" * depth + b"]" * depth)


# (id, body, status, the error's code: None for a field's type, named in its param)
REFUSED: list[tuple[str, bytes, int, str | None]] = [
    ("empty", b"", 400, "invalid_json"),
    ("truncated", chat(HI)[:-3], 400, "invalid_json"),
    ("trailing-garbage", chat(HI) + b"xyz", 400, "invalid_json"),
    ("byte-order-mark", b"\xef\xbb\xbf" + chat(HI), 400, "invalid_json"),
    ("nan", chat(HI).replace(b"}]", b', "n": NaN}]'), 400, "invalid_json"),
    ("100k-nested-arrays", b"[" * DEEP + b"]" * DEEP, 400, "invalid_json"),
    ("100k-nested-objects", b'{"a":' * DEEP + b"1" + b"}" * DEEP, 400, "invalid_json"),
    ("100k-nested-content", _nested_in_content(DEEP), 400, "invalid_json"),
    ("not-utf8-in-text", chat(HI).replace(b"hi", b"h\xff\xfe"), 400, "invalid_json"),
    ("not-utf8-in-key", chat(HI).replace(b'"role"', b'"r\xc3\x28le"'), 400, "invalid_json"),
    ("utf8-encoded-surrogate", chat(HI).replace(b"hi", b"\xed\xa0\x80"), 400, "invalid_json"),
    ("raw-nul", chat(HI).replace(b"hi", b"h\x00i"), 400, "invalid_json"),
    ("lone-high-surrogate", chat(HI).replace(b"hi", b"\\ud800"), 400, "invalid_json"),
    ("lone-low-surrogate", chat(HI).replace(b"hi", b"\\udc00"), 400, "invalid_json"),
    ("reversed-surrogates", chat(HI).replace(b"hi", b"\\udc00\\ud800"), 400, "invalid_json"),
    ("model-int", chat(HI).replace(b'"sim-model"', b"1"), 400, None),
    ("model-null", chat(HI).replace(b'"sim-model"', b"null"), 400, None),
    ("model-list", chat(HI).replace(b'"sim-model"', b'["sim-model"]'), 400, None),
    ("model-empty", chat(HI).replace(b'"sim-model"', b'""'), 400, None),
    ("messages-object", chat(HI).replace(orjson.dumps(HI), b'{"role": "user"}'), 400, None),
    ("messages-string", chat(HI).replace(orjson.dumps(HI), b'"hi"'), 400, None),
    ("messages-null", chat(HI).replace(orjson.dumps(HI), b"null"), 400, None),
    ("message-string", chat(["hi"]), 400, None),
    ("message-null", chat([None]), 400, None),
    ("message-list", chat([["user", "hi"]]), 400, None),
    ("message-without-role", chat([{"content": "hi"}]), 400, None),
    ("role-int", chat([{"role": 1, "content": "hi"}]), 400, None),
    ("content-int", chat([{"role": "user", "content": 1}]), 400, None),
    ("content-object", chat([{"role": "user", "content": {"text": "hi"}}]), 400, None),
    ("content-list-of-strings", chat([{"role": "user", "content": ["hi"]}]), 400, None),
    ("tool-calls-string", chat([{"role": "assistant", "tool_calls": "f()"}, *HI]), 400, None),
    (
        "arguments-object",
        chat(
            [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
                    ],
                },
                *HI,
            ]
        ),
        400,
        None,
    ),
]


@pytest.mark.parametrize(("name", "body", "status", "code"), REFUSED, ids=[c[0] for c in REFUSED])
def test_bad_bodies_get_an_openai_shaped_4xx(
    address: tuple[str, int], sim_reset: str, name: str, body: bytes, status: int, code: str | None
) -> None:
    answer = post(address, body)
    assert answer.status == status, answer.body
    assert answer.headers.get("x-compaction-status") == "rejected"  # by the proxy itself
    error = error_of(answer)
    assert error["code"] == code
    assert code is not None or error["param"], error  # which field is wrong
    assert forwarded(sim_reset) == []


# Bodies the proxy must take, and which reach the upstream (which may refuse them: its
# answer is relayed). (id, body, the simulator's status, whether the proxy compacts)
PASSED: list[tuple[str, bytes, int, bool]] = [
    ("escaped-nul", chat([{"role": "user", "content": "a\u0000b"}]), 200, False),
    (
        "surrogate-pair",
        chat([{"role": "user", "content": "\U0001f600"}]).replace(
            "\U0001f600".encode(), b"\\ud83d\\ude00"
        ),
        200,
        False,
    ),
    ("unknown-role", chat([{"role": "wizard", "content": "hi"}]), 400, False),
    ("unknown-role-compacted", chat([*LONG, {"role": "wizard", "content": "x"}, *HI]), 400, True),
    (
        "orphan-tool-result",
        chat([*LONG, {"role": "tool", "tool_call_id": "nope", "content": "42"}, *HI]),
        400,
        True,
    ),
    (
        "content-parts-compacted",
        chat(
            [
                *LONG[:-2],
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                        {"type": "file", "file": {"file_id": "file-1"}},
                        {"type": "hologram", "hologram": [1, 2]},
                        {"text": "no type"},
                    ],
                },
                LONG[-1],
                *HI,
            ]
        ),
        200,
        True,
    ),
    ("max-tokens-string", chat(HI, max_tokens="12"), 400, False),
    (
        "max-tokens-huge",
        chat(HI).replace(b"{", b'{"max_tokens": 100000000000000000000,', 1),
        400,
        False,
    ),
    ("stream-string", chat(HI, stream="yes"), 200, False),
    ("10k-blank-messages", chat([{"role": "user", "content": ""}] * 10_000), 200, True),
]


@pytest.mark.parametrize(("name", "body", "status", "compacts"), PASSED, ids=[c[0] for c in PASSED])
def test_odd_bodies_reach_the_upstream(
    address: tuple[str, int], sim_reset: str, name: str, body: bytes, status: int, compacts: bool
) -> None:
    answer = post(address, body, [(b"X-Session-Id", name.encode())])
    assert answer.status == status, answer.body
    assert (answer.headers["x-compaction-status"] == "compacted") == compacts, answer.headers
    sent = orjson.loads(body)["messages"][-1]
    assert forwarded(sim_reset)[-1]["messages"][-1] == sent  # the newest message arrived


def test_duplicate_keys_the_last_one_wins_and_the_upstream_gets_one(
    address: tuple[str, int], sim_reset: str
) -> None:
    first = orjson.dumps([*LONG, {"role": "user", "content": "first"}])
    last = orjson.dumps([*LONG, {"role": "user", "content": "last"}])
    body = b'{"model": "other", "messages": %s, "model": "%s", "messages": %s}' % (
        first,
        MODEL.encode(),
        last,
    )
    answer = post(address, body, [(b"X-Session-Id", b"duplicate-keys")])
    assert answer.status == 200, answer.body
    assert answer.headers["x-compaction-status"] == "compacted"
    (sent,) = forwarded(sim_reset)
    assert sent["model"] == MODEL
    assert sent["messages"][-1]["content"] == "last"


def _padded(size: int) -> bytes:
    """A valid chat body of exactly ``size`` bytes (JSON's insignificant whitespace)."""
    body = chat(HI)
    return body + b" " * (size - len(body))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("size", "status"),
    [(MAX_BODY, 200), (MAX_BODY + 1, 413)],
    ids=["at-the-limit", "one-byte-over"],
)
def test_the_body_limit_is_exact(
    address: tuple[str, int], chunked: bool, size: int, status: int
) -> None:
    body = _padded(size)
    assert len(body) == size
    answer = post(address, body, chunked=chunked)
    assert answer.status == status, answer.body[:300]
    if status == 413:
        assert error_of(answer)["code"] == "request_too_large"


@pytest.mark.parametrize("encoding", [b"gzip", b"br", b"deflate", b"gzip, identity", b"x\xff"])
def test_compressed_chat_bodies_get_415(
    address: tuple[str, int], sim_reset: str, encoding: bytes
) -> None:
    body = chat(HI)
    for sent in (body, gzip.compress(body)):
        answer = post(address, sent, [(b"Content-Encoding", encoding)])
        assert answer.status == 415, answer.body
        assert error_of(answer)["code"] == "unsupported_content_encoding"
    assert forwarded(sim_reset) == []
    assert post(address, body, [(b"Content-Encoding", b"identity")]).status == 200


@pytest.mark.parametrize(
    ("value", "status"),
    [
        (b"s" * 1024, 200),
        (b"s" * 16_000, 400),  # over session.max_name_bytes
        (b"caf\xe9", 200),
        ("\u65e5\u672c".encode(), 200),
        (b"a\tb", 200),
        (b"a\nb", 400),
        (b"a\rb", 400),
        (b"a\x00b", 400),
        (b"a\x01b", 400),
        (b"a\x7fb", 400),
    ],
    ids=[
        "1kb",
        "16kb",
        "latin-1",
        "utf-8",
        "tab",
        "newline",
        "carriage-return",
        "nul",
        "control",
        "del",
    ],
)
def test_odd_session_ids(address: tuple[str, int], value: bytes, status: int) -> None:
    """Control characters are refused by the HTTP parser and names over the limit by
    the proxy (OpenAI-shaped 400s); anything else names a session like any other, and
    compacts."""
    answer = post(address, chat([*LONG, *HI]), [(b"X-Session-Id", value)])
    assert answer.status == status, answer.body
    if len(value) > 1024:
        assert error_of(answer)["code"] == "string_above_max_length"
        assert error_of(answer)["param"] == "X-Session-Id"
    elif status == 400:
        assert error_of(answer)["code"] == "invalid_http"
    else:
        assert answer.headers["x-compaction-status"] == "compacted"
        again = post(
            address,
            chat([*LONG, *HI, {"role": "assistant", "content": "ok"}, *HI]),
            [(b"X-Session-Id", value)],
        )
        assert again.headers["x-compaction-status"] == "snapshot"


# --- the fuzzer ------------------------------------------------------------------------

_sent = [0]


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,  # the same 2,000 requests on every run: a failure reproduces
    database=None,
    # The explain phase re-runs examples to find which parts matter: slow over sockets.
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=fuzzing.requests())
def test_fuzzed_requests_never_get_a_5xx_or_hang(address: tuple[str, int], request: bytes) -> None:
    fuzzing.check(fuzzing.exchange(address, request))
    _sent[0] += 1
    if _sent[0] % HEALTH_EVERY == 0:
        assert fuzzing.exchange(address, HEALTH, 5).status == 200


def test_the_proxy_still_serves_after_the_fuzzer(address: tuple[str, int]) -> None:
    host, port = address
    bound = slack_s(f"http://{host}:{port}", 2.0)  # more on a busy machine
    started = time.monotonic()
    assert post(address, chat(HI)).status == 200
    assert time.monotonic() - started < bound
