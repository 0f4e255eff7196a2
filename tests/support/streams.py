"""A history that overflows the simulator's ``sim-big`` model (REAL tokens), for the
stream overflow tests."""

from __future__ import annotations

from typing import Any

import orjson

REAL = 6144


def long_history() -> list[dict[str, Any]]:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 400}
        for i in range(20)
    ]
    return [*turns, {"role": "user", "content": "and now?"}]


OVERFLOW_ERROR = orjson.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. However, your "
            "messages resulted in 9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
)
