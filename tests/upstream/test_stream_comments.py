"""SSE comments a thinking model's server sends before the first event reach the client
as they come, and an overflow in that first event is still recovered (issue 20, item 7).

OpenRouter sends ``: OPENROUTER PROCESSING`` every second while a model thinks. The
proxy holds a stream until its first event to recover from an overflow reported
there; held comments reached the client only with that event (after 8 s), and a load
balancer with an idle timeout would cut such a stream through the proxy.

Which comments go ahead, and a failed retry's error event, here; through a real proxy:
tests/e2e/test_stream_comments_e2e.py.
"""

from __future__ import annotations

import orjson
import pytest

from proxy.upstream.stream_head import comments_ahead
from tests.support.streams import OVERFLOW_ERROR


@pytest.mark.parametrize(
    ("pending", "sent", "held"),
    [
        (b": a\n\n: b\n\npartial", b": a\n\n: b\n\n", b"partial"),
        (
            b'event: response.created\ndata: {}\n\n: a\r\n\r\ndata: {"x": 1}\n\n: b\n\n',
            b": a\r\n\r\n",
            b'event: response.created\ndata: {}\n\ndata: {"x": 1}\n\n: b\n\n',
        ),
        (b'data: {"x": 1}\n\n: a\n\n', b"", b'data: {"x": 1}\n\n: a\n\n'),
    ],
)
def test_only_comments_before_the_first_event_go_ahead(
    pending: bytes, sent: bytes, held: bytes
) -> None:
    assert comments_ahead(pending) == (sent, held)


def test_a_failed_retry_on_a_responses_stream_is_an_error_event_in_its_shape() -> None:
    from proxy.routes.responses import _stream_error

    error = orjson.loads(OVERFLOW_ERROR)["error"]
    event = _stream_error(error)
    assert event.startswith(b"event: error\ndata: ")
    assert event.endswith(b"\n\n")
    data = orjson.loads(event.split(b"data: ", 1)[1])
    assert data == {
        "type": "error",
        "code": "context_length_exceeded",
        "message": error["message"],
        "param": "messages",
        "sequence_number": 0,
    }
