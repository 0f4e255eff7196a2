"""What the request fuzzer sends and how it judges the answer (tests/e2e/test_fuzz.py,
bench/fuzz.py).

Requests are written as raw bytes on a socket of their own, so anything goes:
header values no HTTP client library would send, chunked framing, gzip bodies,
bodies that are not JSON or not UTF-8. The framing itself is always consistent
(a Content-Length that lies would only make the proxy wait for its body timeout,
which is test_client_limits' subject).

The verdict: an answer arrives within ``ANSWER_S``; it is never a 5xx (the
upstream, the project's simulator, is healthy and never sent ``X-Sim-*``
headers that would make it fail); an error the proxy wrote itself is in
OpenAI's shape. A relayed chat answer carries ``X-Compaction-Status``.
"""

from __future__ import annotations

import gzip
import socket
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import strategies as st

ANSWER_S = 15.0  # a request not answered within this is a hang
MODEL = "sim-model"
WINDOW = {"match": "*", "context_window": 2048, "max_output_tokens": 256}
MAX_BODY = 1024 * 1024
# The proxy the fuzzer runs against: the simulator behind it, a small window so bodies
# of a few KB compact, a body limit a fuzzed body can reach, an admin key to fuzz with.
PROXY_CONFIG: dict[str, Any] = {
    "models": [WINDOW],
    "server": {"max_body_bytes": MAX_BODY, "admin_key": "adm"},
}
_FILLER = " ".join(f"word{i}" for i in range(60))


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names; a repeated header's values joined by ", "
    body: bytes


def exchange(address: tuple[str, int], request: bytes, timeout_s: float = ANSWER_S) -> Answer:
    """Send ``request`` (it asks for ``Connection: close``) and read the whole answer."""
    deadline = time.monotonic() + timeout_s
    data = b""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        with suppress(OSError):  # refused mid-send (a 413 or 431 sent early): read what came
            sock.sendall(request)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(262144)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"no answer within {timeout_s} s") from None
            if not chunk:
                break
            data += chunk
        else:
            raise AssertionError(f"the answer did not end within {timeout_s} s")
    return _parse(data)


def _parse(data: bytes) -> Answer:
    while data.startswith(b"HTTP/1.1 100"):  # Expect: 100-continue answered first
        data = data.partition(b"\r\n\r\n")[2]
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"not an HTTP answer: {data[:200]!r}"
    status_line, *lines = head.split(b"\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        body = _dechunk(body)
    return Answer(int(status_line.split()[1]), headers, body)


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += body[:size]
        body = body[size + 2 :]
    return out


def check(answer: Answer) -> None:
    """The verdict on one answer; raises AssertionError."""
    assert answer.status < 500, (answer.status, answer.body[:500])
    relayed = "x-compaction-status" in answer.headers
    if answer.status >= 400 and not relayed:
        assert answer.headers.get("content-type", "").startswith("application/json"), answer
        error = orjson.loads(answer.body)["error"]
        assert set(error) >= {"message", "type", "param", "code"}, error


def request_bytes(
    method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes, chunked: bool
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1".encode("latin-1"), b"Host: fuzz"]
    lines += [name + b": " + value for name, value in headers]
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in _pieces(body)) + b"0\r\n\r\n"
    else:
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: %d" % len(body))
        framed = body
    return b"\r\n".join(lines) + b"\r\n\r\n" + framed


def _pieces(body: bytes, size: int = 4096) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def history(turns: int) -> list[dict[str, Any]]:
    """A system prompt and ``turns`` question/answer pairs (~200 tokens each)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: {_FILLER}"})
        messages.append({"role": "assistant", "content": f"answer {i}: {_FILLER}"})
    return messages


# --- strategies ---------------------------------------------------------------------

_words = st.lists(st.sampled_from(["alpha", "beta", "gamma", "tool", "user", "\u00e9t\u00e9"]))
_text = st.one_of(_words.map(" ".join), st.text(max_size=40))
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
json_values = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["type", "text", "role", "content", "x"]), inner),
    ),
    max_leaves=8,
)
_roles = st.one_of(
    st.sampled_from(["user", "assistant", "system", "developer", "tool", "function"]),
    st.sampled_from(["user", "assistant", "tool"]),
    st.sampled_from(["", "wizard", "USER", "user\x00"]),
    json_values,
)
_parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": json_values}),
    st.fixed_dictionaries(
        {"type": st.just("input_audio"), "input_audio": st.one_of(json_values, st.just({}))}
    ),
    st.fixed_dictionaries({"type": st.just("file"), "file": json_values}),
    st.fixed_dictionaries({"type": _text, "x": json_values}),
    st.dictionaries(st.sampled_from(["type", "text"]), json_values),
)
_tool_call = st.fixed_dictionaries(
    {"id": _text, "type": st.just("function")},
    optional={
        "function": st.one_of(
            st.fixed_dictionaries({"name": _text, "arguments": _text}), json_values
        )
    },
)
_message = st.fixed_dictionaries(
    {"role": _roles},
    optional={
        "content": st.one_of(_text, _text, st.none(), st.lists(_parts, max_size=3), json_values),
        "name": st.one_of(_text, json_values),
        "tool_call_id": st.one_of(_text, json_values),
        "tool_calls": st.one_of(st.lists(_tool_call, max_size=2), json_values),
    },
)
_top_level = st.dictionaries(
    st.sampled_from(
        ["max_tokens", "max_completion_tokens", "stream", "n", "tools", "response_format", "user"]
    ),
    st.one_of(json_values, st.integers(-5, 10**6), st.booleans()),
    max_size=3,
)


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A chat request: a history under or over the small window's trigger, odd messages
    spliced in, odd top-level fields, the model sometimes of the wrong type."""
    messages: list[Any] = history(draw(st.sampled_from([0, 0, 1, 6, 10])))
    # Half the requests are well-formed throughout; the rest carry odd messages.
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        messages.insert(draw(st.integers(0, len(messages))), draw(_message))
    if draw(st.integers(0, 9)):
        messages.append({"role": "user", "content": draw(_text)})
    body: dict[str, Any] = {"model": MODEL, "messages": messages, **draw(_top_level)}
    if not draw(st.integers(0, 14)):
        body["model"] = draw(json_values)
    if not draw(st.integers(0, 14)):
        body["messages"] = draw(json_values)
    return body


_SPLICES = [
    b"\x00",
    b"\xff\xfe",
    b"\xed\xa0\x80",  # a surrogate encoded as UTF-8 (CESU-8)
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b"[" * 2000,
    b"]}",
    b'"model": "x", "model": 1,',
    b"\xef\xbb\xbf",
    b"NaN",
]


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Mostly JSON chat requests, some cut, spliced or replaced by other bytes."""
    raw = orjson.dumps(draw(chat_bodies()))
    kind = draw(st.integers(0, 14))
    if kind == 0:
        return raw[: draw(st.integers(1, len(raw) - 1))]
    if kind == 1:
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from(_SPLICES)) + raw[at:]
    if kind == 2:
        return draw(st.one_of(st.binary(max_size=200), json_values.map(orjson.dumps)))
    if kind == 3:
        depth = draw(st.sampled_from([100, 254, 255, 1025, 100_000]))
        return raw.replace(
            b'"messages":', b'"metadata":' + b"[" * depth + b"]" * depth + b',"messages":', 1
        )
    return raw


_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_0123456789", min_size=1, max_size=20)
# Visible latin-1 and tab: what may stand in a header value without breaking the framing.
_value = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f")
    | st.just("\t"),
    max_size=60,
).map(lambda v: v.strip().encode("latin-1"))
_session = st.one_of(
    _value,
    st.text(max_size=30).map(lambda v: v.encode("utf-8").replace(b"\r", b"").replace(b"\n", b"")),
    st.integers(1, 16_000).map(lambda n: b"s" * n),
)
_CHOSEN: list[tuple[bytes, st.SearchStrategy[bytes]]] = [
    (
        b"Authorization",
        st.sampled_from([b"Bearer sk-a", b"Bearer sk-b", b"Bearer adm", b"", b"Bearer", b"Basic x"])
        | _value,
    ),
    (b"X-Session-Id", _session),
    (b"X-Compaction", st.sampled_from([b"off", b"force", b"FORCE ", b"on"]) | _value),
    (b"Content-Type", st.sampled_from([b"application/json", b"text/plain", b""]) | _value),
    (b"Accept-Encoding", st.sampled_from([b"gzip", b"br", b"identity", b"*"]) | _value),
    (b"Content-Encoding", st.sampled_from([b"identity", b"gzip", b"br"]) | _value),
    (b"Expect", st.just(b"100-continue")),
    (b"api-key", _value),
    (b"X-Compaction-Purpose", st.just(b"summarize")),
    (b"Cookie", _value),
]


@st.composite
def headers(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    chosen = draw(st.lists(st.sampled_from(range(len(_CHOSEN))), max_size=5))
    out = [(_CHOSEN[i][0], draw(_CHOSEN[i][1])) for i in chosen]
    for _ in range(draw(st.integers(0, 4))):
        name = draw(_token)
        if not name.lower().startswith("x-sim-"):  # those make the simulator fail on purpose
            out.append((name.encode(), draw(_value)))
    # Connection: close always (one request per socket), sometimes naming others.
    named = draw(st.sampled_from([b"", b", authorization", b", x-session-id", b", content-type"]))
    out.append((b"Connection", b"close" + named))
    return out


_SESSION_PATHS = ["abc", "a%0Ab", "%00", "%ff%fe", "x" * 3000, "..", "a/b"]
_OTHER_ROUTES = st.one_of(
    st.sampled_from(
        [
            ("GET", "/v1/models"),
            ("POST", "/v1/embeddings"),
            ("POST", "/v1/completions"),
            ("GET", "/v1/chat/completions"),
            ("DELETE", "/v1/models"),
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/metrics"),
            ("GET", "/nope"),
            ("GET", "/admin/sessions?limit=3"),
            ("GET", "/admin/sessions?limit=%ff"),
        ]
    ),
    st.tuples(
        st.sampled_from(["GET", "DELETE", "POST"]),
        st.sampled_from(_SESSION_PATHS).map("/sessions/{}".format),
    ).map(lambda r: (r[0], r[1] + "/compact" if r[0] == "POST" else r[1])),
)
_CHAT = ("POST", "/v1/chat/completions")


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One whole HTTP/1.1 request."""
    # Three in four requests are chats: the route that parses, compacts and rewrites.
    method, target = _CHAT if draw(st.integers(0, 3)) else draw(_OTHER_ROUTES)
    head = draw(headers())
    body = draw(bodies()) if method in ("POST", "PUT", "DELETE") else b""
    if any(v == b"gzip" for k, v in head if k == b"Content-Encoding") and draw(st.booleans()):
        body = gzip.compress(body)
    chunked = draw(st.integers(0, 4)) == 0 and bool(body)
    return request_bytes(method, target, head, body, chunked)
