"""Where one compacting request goes upstream, and the shapes of its API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.core.outcome import Outcome
from proxy.upstream.overflow import Overflow
from proxy.upstream.stream_head import chat_stream_error


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes upstream and the shapes of its API (chat completions, or
    Responses in responses.py) that steps 9-11 need: how a view becomes the request
    body, how a too-large output budget is lowered, where an answer states the
    prompt's tokens."""

    url: str
    headers: list[tuple[bytes, bytes]]
    body_for: Callable[[Outcome], bytes]
    lower_output: Callable[[bytes, Overflow], bytes | None]
    prompt_tokens: Callable[[bytes], int | None]
    stream_error: Callable[[dict[str, Any]], bytes] = chat_stream_error  # stream_head.py
