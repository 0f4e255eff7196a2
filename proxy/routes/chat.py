"""``POST /v1/chat/completions``: the API the pipeline's steps are written in.

Its messages are the chat view itself, so the body for a view is the client's own
bytes, or its request with the rebuilt messages; an output budget too large for
the model lowers ``max_completion_tokens`` and ``max_tokens``; an answer states its
prompt's tokens as ``usage.prompt_tokens``; a stream carries an error as a data
line with an ``error`` object. No request goes upstream untouched: under
``X-Compaction: off`` its view is the body as sent (bypassed), its session still named.
"""

from __future__ import annotations

from typing import Any, cast

import orjson

from proxy.core.outcome import Outcome
from proxy.routes.parse import parse_chat_request
from proxy.routes.summary_bodies import chat_summary
from proxy.routes.tool_shapes import CHAT_TOOL
from proxy.types import ChatRequest
from proxy.upstream.api import Api
from proxy.upstream.calibrate import find_prompt_tokens
from proxy.upstream.overflow import Overflow
from proxy.upstream.stream_head import error_event


def parse(
    body: bytes, max_messages: int, max_model_bytes: int
) -> tuple[dict[str, Any], ChatRequest]:
    """The request, which is its own chat view."""
    chat = parse_chat_request(body, max_messages, max_model_bytes)
    return cast(dict[str, Any], chat), chat


def outgoing_body(body: bytes, data: dict[str, Any], outcome: Outcome) -> bytes:
    """The request for the upstream: the client's own bytes when the view is the history
    as sent, else the request with the rebuilt messages."""
    if outcome.messages is None:
        return body
    return orjson.dumps({**data, "messages": outcome.messages})


def lower_output(body: bytes, verdict: Overflow) -> bytes | None:
    """The body with its output budget lowered to what the model allows; None if unchanged."""
    data = orjson.loads(body)
    keys = [k for k in ("max_completion_tokens", "max_tokens") if isinstance(data.get(k), int)]
    current = min((int(data[k]) for k in keys), default=0)
    allowed = verdict.limit or current // 2
    if allowed <= 0 or (keys and allowed >= current):
        return None
    for k in keys or ["max_tokens"]:
        data[k] = allowed
    return orjson.dumps(data)


def stream_error(error: dict[str, Any]) -> bytes:
    """An error as a chat completions stream carries one (the SDKs raise it)."""
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


class ChatApi(Api):
    """Chat completions: its request is its own chat view (the module's doc)."""

    name = "chat"
    path = "chat/completions"
    recall_tool = CHAT_TOOL
    parse = staticmethod(parse)
    body_for = staticmethod(outgoing_body)
    lower_output = staticmethod(lower_output)
    prompt_tokens = staticmethod(find_prompt_tokens)
    stream_failure = staticmethod(error_event)
    stream_error = staticmethod(stream_error)
    summary_body = staticmethod(chat_summary)


CHAT = ChatApi()
