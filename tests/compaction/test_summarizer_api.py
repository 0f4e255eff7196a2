"""The summarizer on the Responses API (``upstream.summarizer_api: responses``), in-process:
the request it sends and how its answer is read.

End to end: tests/e2e/test_summarizer_api_e2e.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.compaction.summary_api import read_answer, request_body
from proxy.errors import SummaryError


def _response(status: str, output: list[Any], reason: str | None = None) -> bytes:
    details = {"reason": reason} if reason else None
    return orjson.dumps({"status": status, "incomplete_details": details, "output": output})


def _message(*texts: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    return {"type": "message", "role": "assistant", "content": content}


def test_a_responses_answer_reads_its_output_text_parts_in_order() -> None:
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": "opaque"}
    raw = _response("completed", [reasoning, _message("## Goal\n", "FACT a=1")])
    reading = read_answer("responses", raw)
    assert (reading.text, reading.finish_reason) == ("## Goal\nFACT a=1", "stop")


def test_incomplete_for_max_output_tokens_reads_as_length() -> None:
    reading = read_answer(
        "responses", _response("incomplete", [_message("cut")], "max_output_tokens")
    )
    assert reading.finish_reason == "length"
    other = read_answer("responses", _response("incomplete", [_message("x")], "content_filter"))
    assert other.finish_reason == "content_filter"


@pytest.mark.parametrize(
    "raw",
    [
        _response("failed", [_message("x")]),
        orjson.dumps({"status": "completed"}),
        orjson.dumps({"output": [{"type": "message", "content": [{"type": "output_text"}]}]}),
        b"not json",
    ],
)
def test_a_responses_answer_without_a_summary_is_an_error(raw: bytes) -> None:
    with pytest.raises(SummaryError):
        read_answer("responses", raw)


def test_the_responses_request_carries_instructions_input_and_max_output_tokens() -> None:
    body = orjson.loads(request_body("responses", "m", "INSTRUCTIONS", "PROMPT", 300))
    assert body == {
        "model": "m",
        "instructions": "INSTRUCTIONS",
        "input": "PROMPT",
        "max_output_tokens": 300,
        "temperature": 0,
        "stream": False,
        "store": False,
    }
    chat = orjson.loads(request_body("chat", "m", "INSTRUCTIONS", "PROMPT", 300))
    assert chat["messages"][0] == {"role": "system", "content": "INSTRUCTIONS"}
    assert chat["max_tokens"] == 300
