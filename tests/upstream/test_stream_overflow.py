"""An overflow reported inside a 200 event stream (issue 8): which events are errors.

Recovered like a 400 through a real proxy: tests/e2e/test_stream_overflow_e2e.py.
"""

from __future__ import annotations

import pytest

from proxy.upstream.stream_head import error_event


@pytest.mark.parametrize(
    ("head", "is_error"),
    [
        (b'data: {"error": {"message": "too long", "code": "context_length_exceeded"}}\n\n', True),
        (b'event: error\ndata: {"message": "prompt is too long"}\n\n', True),
        (b'event: response.failed\ndata: {"type": "response.failed"}\n\n', True),
        (b'data: {"id": "x", "choices": [{"delta": {"content": "error"}}]}\n\n', False),
        (b'data: {"id": "x", "choices": [], "error": null}\r\n\r\n', False),
        (b": keep-alive comment\n\n", False),
        # OpenRouter sends processing comments before anything else.
        (
            b": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING\n\n"
            b'data: {"error": {"message": "maximum context length is 8192 tokens"}}\n\n',
            True,
        ),
        (b': OPENROUTER PROCESSING\n\ndata: {"choices": [{"delta": {}}]}\n\n', False),
        (b"data: not json but says error\n\n", False),
    ],
)
def test_only_an_error_event_is_taken_for_an_error(head: bytes, is_error: bool) -> None:
    assert (error_event(head) is not None) is is_error
