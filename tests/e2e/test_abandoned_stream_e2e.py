"""A client that stops reading a stream and resets must not leave the proxy pulling the
rest of it for no one, even from an upstream that always has the next bytes ready.

Starlette notices the disconnect and cancels the relaying task, but that cancellation
lands only while the task waits; a task fed by an upstream that never pauses is never
found waiting, and sends to a closed connection return at once, so before the relay
checked for the disconnect between chunks it read on (tens to hundreds of MB a stream,
on loopback). The proxy runs as its own process (``compaction-proxy serve``), as in
production: in the test process it shares a GIL with the upstream and reads slower.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from tests.support.faulty_upstream import FaultyUpstream, Firehose, chunk_event

LIMIT = 512 * 1024 * 1024  # what the upstream would send in all, unless hung up on
READ = 256 * 1024  # what the client reads before it stops
# What the proxy may still take after the reset: the chunk in hand, and a little; the
# code that did not check pulled far more (bench/README.md, "Figures behind the code").
AFTER_RESET = 8 * 1024 * 1024
# The bytes bound is what catches a relay that reads on. The time to close is reported
# (the closed_after_s property, with -rP or the junit XML) against the one
# second, and asserted only against a bound no loaded 2-core machine reaches.
CLOSED_WITHIN_S = 1.0
CLOSED_AT_WORST_S = 8.0

_CHAT_EVENT = chunk_event("x" * 200)
_MESSAGES_EVENT = b"event: content_block_delta\ndata: " + orjson.dumps(
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * 200}}
)
_MESSAGES_EVENT += b"\n\n"
ROUTES = {
    "chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "go on"}], "stream": True},
        _CHAT_EVENT,
    ),
    "messages": (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "go on"}],
            "stream": True,
        },
        _MESSAGES_EVENT,
    ),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    with FaultyUpstream() as up:
        yield up


def read_then_reset(url: str, path: str, body: dict[str, Any], fire: Firehose) -> int:
    """Send a streamed request on a socket of its own, read ``READ`` bytes, stop reading
    until the proxy stops taking the upstream's bytes, then reset the connection (RST).
    Returns what the upstream had sent by the reset."""
    host, port = url.removeprefix("http://").split(":")
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-firehose\r\n"
        "x-api-key: sk-firehose\r\nanthropic-version: 2023-06-01\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + payload)
        got = 0
        while got < READ:
            data = sock.recv(64 * 1024)
            assert data, "the proxy ended the stream before the client stopped reading"
            got += len(data)
        sent = fire.steady()  # the client reads no more: the proxy's writes are paused
        assert not fire.ended.is_set(), "the upstream stopped before the client left"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sent


@pytest.mark.parametrize("route", list(ROUTES))
def test_an_abandoned_fast_stream_is_closed_at_once(
    upstream: FaultyUpstream,
    spawn_proxy: Callable[[dict[str, Any]], str],
    route: str,
    record_property: Callable[[str, object], None],
) -> None:
    path, body, event = ROUTES[route]
    fire = Firehose(event, LIMIT)
    upstream.chat = fire
    url = spawn_proxy({"upstream": {"base_url": f"{upstream.url}/v1"}})

    sent = read_then_reset(url, path, body, fire)
    reset_at = time.monotonic()

    assert fire.ended.wait(10), "the upstream was still streaming 10 s after the client left"
    assert fire.hung_up, "the proxy read the stream to its end for a client that had left"
    pulled = fire.sent - sent
    assert pulled < AFTER_RESET, f"the proxy pulled {pulled / 2**20:.0f} MiB for no one"
    took = fire.ended_at - reset_at
    record_property("closed_after_s", round(took, 3))
    record_property("closed_within_goal", took < CLOSED_WITHIN_S)
    print(f"{route}: the upstream connection closed {took:.3f} s after the reset")
    assert took < CLOSED_AT_WORST_S, f"the upstream connection stayed open {took:.2f} s"
