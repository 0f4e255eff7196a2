"""Per-request ``X-Sim-*`` headers, so one simulator can play many upstreams.

The proxy forwards headers it does not know, so a test sets these on its own
request and the simulator sees them:

``X-Sim-Error-Format``          openai | vllm | vllm_legacy | anthropic | llamacpp | gateway413
``X-Sim-Context-Window``        context window in tokens
``X-Sim-Max-Output-Tokens``     the model's output limit
``X-Sim-Strict-Alternation``    1/true or 0/false
``X-Sim-Latency-Ms``            delay before a non-streamed answer
``X-Sim-Header-Delay-Ms``       delay before any answer's headers, streamed or not
``X-Sim-First-Byte-Delay-Ms``   delay before the first SSE chunk
``X-Sim-Chunk-Delay-Ms``        delay between SSE chunks
``X-Sim-Thinking-Ms``           a stream (an in-stream error too) opens with this long of
                                ``: PROCESSING`` comments before its first event
``X-Sim-Comment-Interval-Ms``   how often those comments come (default 1000)
``X-Sim-Fail``                  answer this HTTP status with a realistic error body
``X-Sim-Ignore-Tool-Choice``    1/true: call tools under ``tool_choice: none`` (every API)
                                too, as a small model may
``X-Sim-Errors-In-Stream``      1/true: a streamed request's overflow comes as a 200 event
                                stream whose first event is the error (as some servers do);
                                on /v1/responses, as ``response.failed`` after the
                                stream's ``response.created`` and ``response.in_progress``
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar, cast

from proxy.simulator.config import ERROR_FORMATS, ErrorFormat, ModelProfile
from proxy.simulator.errors import SimError, invalid_request

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Overrides:
    error_format: ErrorFormat | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    strict_alternation: bool | None = None
    latency_ms: float | None = None
    header_delay_ms: float | None = None
    errors_in_stream: bool | None = None
    first_byte_delay_ms: float | None = None
    chunk_delay_ms: float | None = None
    fail: int | None = None
    thinking_ms: float | None = None
    comment_interval_ms: float | None = None
    ignore_tool_choice: bool | None = None

    def apply(self, profile: ModelProfile) -> ModelProfile:
        if self == NO_OVERRIDES:
            return profile
        return replace(
            profile,
            error_format=self.error_format or profile.error_format,
            context_window=self.context_window or profile.context_window,
            max_output_tokens=self.max_output_tokens or profile.max_output_tokens,
            strict_alternation=(
                profile.strict_alternation
                if self.strict_alternation is None
                else self.strict_alternation
            ),
        )


NO_OVERRIDES = Overrides()


def _bad(header: str, value: str, expected: str) -> SimError:
    return invalid_request(f"Invalid {header} header: {value!r} (expected {expected}).")


def _positive_int(header: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise _bad(header, value, "a positive integer") from None
    if number < 1:
        raise _bad(header, value, "a positive integer")
    return number


def _millis(header: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _bad(header, value, "milliseconds") from None
    if not math.isfinite(number) or number < 0:
        raise _bad(header, value, "milliseconds")
    return number


def _optional(headers: Mapping[str, str], name: str, parse: Callable[[str, str], T]) -> T | None:
    raw = headers.get(name.lower())
    return None if raw is None else parse(name, raw)


def _error_format(header: str, value: str) -> ErrorFormat:
    fmt = value.strip().lower()
    if fmt not in ERROR_FORMATS:
        raise _bad(header, value, " | ".join(ERROR_FORMATS))
    return cast(ErrorFormat, fmt)


def _flag(header: str, value: str) -> bool:
    flag = value.strip().lower()
    if flag not in _TRUE + _FALSE:
        raise _bad(header, value, "1 or 0")
    return flag in _TRUE


def _status(header: str, value: str) -> int:
    status = _positive_int(header, value)
    if not 400 <= status <= 599:
        raise _bad(header, value, "an HTTP error status, 400-599")
    return status


def read_overrides(headers: Mapping[str, str]) -> Overrides:
    """Parse the ``X-Sim-*`` headers; a malformed value is the client's 400."""
    if not any(key.startswith("x-sim-") for key in headers):
        return NO_OVERRIDES  # the common case, and the cheap one
    return Overrides(
        error_format=_optional(headers, "X-Sim-Error-Format", _error_format),
        context_window=_optional(headers, "X-Sim-Context-Window", _positive_int),
        max_output_tokens=_optional(headers, "X-Sim-Max-Output-Tokens", _positive_int),
        strict_alternation=_optional(headers, "X-Sim-Strict-Alternation", _flag),
        latency_ms=_optional(headers, "X-Sim-Latency-Ms", _millis),
        header_delay_ms=_optional(headers, "X-Sim-Header-Delay-Ms", _millis),
        errors_in_stream=_optional(headers, "X-Sim-Errors-In-Stream", _flag),
        first_byte_delay_ms=_optional(headers, "X-Sim-First-Byte-Delay-Ms", _millis),
        chunk_delay_ms=_optional(headers, "X-Sim-Chunk-Delay-Ms", _millis),
        fail=_optional(headers, "X-Sim-Fail", _status),
        thinking_ms=_optional(headers, "X-Sim-Thinking-Ms", _millis),
        comment_interval_ms=_optional(headers, "X-Sim-Comment-Interval-Ms", _millis),
        ignore_tool_choice=_optional(headers, "X-Sim-Ignore-Tool-Choice", _flag),
    )


def errors_in_stream(headers: Mapping[str, str]) -> bool:
    """Whether ``X-Sim-Errors-In-Stream`` asks for an overflow as an event stream (a
    malformed header answers no: the request's own 400 comes first)."""
    try:
        return bool(read_overrides(headers).errors_in_stream)
    except SimError:
        return False
