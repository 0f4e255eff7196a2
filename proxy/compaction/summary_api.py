"""The summary call in the upstream's API: chat completions, the Responses API or
Anthropic's Messages API.

``upstream.summarizer_api`` picks one per upstream (one that serves only
``/v1/responses`` or ``/v1/messages`` can still summarize). Either way the summarizer
sees the same instructions and prompt, and an answer cut off by its token limit reads
as ``finish_reason: length``: chat says so itself, Responses says ``status:
incomplete`` with ``incomplete_details.reason: max_output_tokens``, Messages says
``stop_reason: max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.errors import SummaryError

SummarizerApi = Literal["chat", "responses", "messages"]

# The path under upstream.base_url each API's summary call goes to.
PATHS: dict[SummarizerApi, str] = {
    "chat": "chat/completions",
    "responses": "responses",
    "messages": "messages",
}


# An answer's bytes, at most: its envelope (ids, usage, a reasoning item; the Responses API
# echoes the instructions) and, per token it was allowed, more bytes than any token takes
# as JSON (a CJK character escaped as \uXXXX is 6, a long run of spaces one token). An
# answer past that ignored max_tokens: it is not read, let alone parsed (summarize.py).
_ENVELOPE_BYTES = 64 * 1024
_BYTES_PER_TOKEN = 32


def answer_limit(max_tokens: int) -> int:
    """The most bytes an answer within ``max_tokens`` can take, with room to spare."""
    return _ENVELOPE_BYTES + _BYTES_PER_TOKEN * max(max_tokens, 0)


@dataclass(frozen=True, slots=True)
class Reading:
    """What the summarizer answered: its text (maybe empty) and why it stopped."""

    text: str
    finish_reason: str


def request_body(
    api: SummarizerApi, model: str, instructions: str, prompt: str, max_tokens: int
) -> bytes:
    """The summary request: unstreamed, temperature 0, at most ``max_tokens``."""
    if api == "messages":
        return orjson.dumps(
            {
                "model": model,
                "system": instructions,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": False,
            }
        )
    if api == "responses":
        return orjson.dumps(
            {
                "model": model,
                "instructions": instructions,
                "input": prompt,
                "max_output_tokens": max_tokens,
                "temperature": 0,
                "stream": False,
                # Nothing to chain on: the provider need not keep it.
                "store": False,
            }
        )
    return orjson.dumps(
        {
            "model": model,
            "messages": [
                {"role": "system", "content": instructions},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": False,
        }
    )


def read_answer(api: SummarizerApi, raw: bytes) -> Reading:
    """The text and finish reason of a 200 answer; raises SummaryError on any other shape."""
    try:
        data = orjson.loads(raw)
        if api == "responses":
            return _read_response(data)
        if api == "messages":
            return _read_message(data)
        choice = data["choices"][0]
        text = choice["message"]["content"]
        finish = choice.get("finish_reason")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise SummaryError("summarizer answer had no message content") from exc
    if not isinstance(text, str):
        raise SummaryError("summarizer answer had no message content")
    return Reading(text, finish if isinstance(finish, str) else "")


def _read_response(data: Any) -> Reading:
    """A ``response`` object: the ``output_text`` parts of its message items, in order
    (what the SDKs call ``output_text``; reasoning items carry none)."""
    parts = [
        part["text"]
        for item in data["output"]
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if part.get("type") == "output_text"
    ]
    if not all(isinstance(p, str) for p in parts):
        raise SummaryError("summarizer answer had no message content")
    status = data.get("status")
    if status == "incomplete":
        details = data.get("incomplete_details") or {}
        reason = details.get("reason") if isinstance(details, dict) else None
        # Chat's word for the same thing, so one check covers both APIs.
        finish = "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    elif status in (None, "completed"):
        finish = "stop"
    else:  # failed, cancelled, queued, in_progress: no summary to keep
        raise SummaryError(f"summarizer response status {status}")
    return Reading("".join(parts), finish)


def _read_message(data: Any) -> Reading:
    """A Messages ``message``: its text blocks, in order (thinking blocks carry none)."""
    parts = [block["text"] for block in data["content"] if block.get("type") == "text"]
    if not all(isinstance(p, str) for p in parts):
        raise SummaryError("summarizer answer had no message content")
    stop = data.get("stop_reason")
    # Chat's word for a cut-off answer, so one check covers every API.
    return Reading("".join(parts), "length" if stop == "max_tokens" else str(stop or "stop"))
