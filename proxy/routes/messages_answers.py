"""Anthropic's ``context_management`` in the proxy's hands (context_edits.py), on the way
out and back: ``Carried`` writes the body a view goes upstream as (the clearing edits
applied, ``context_management`` left out), and edits the upstream's answer as the API
shapes one: ``context_management.applied_edits`` (in a stream: on ``message_delta``),
and, when the view carries a summary under a ``compact_20260112`` edit, a ``compaction``
block first (in a stream: its start, one ``compaction_delta``, its stop, every later
block's ``index`` one up). ``paused`` is the proxy's own answer under
``pause_after_compaction``: that block alone, ``stop_reason: "compaction"``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response

from proxy.core.outcome import Outcome, Turn
from proxy.routes import compaction_blocks as cb
from proxy.routes import context_edits as ce
from proxy.routes.compaction_items import Sealer
from proxy.routes.messages_chat import Message, to_anthropic

_BLOCK_EVENTS = (b"content_block_start", b"content_block_delta", b"content_block_stop")


class Carried:
    """One request's edits, carried out by the proxy for its tenant."""

    def __init__(self, edits: ce.Edits, tenant: str, sealer: Sealer) -> None:
        self.edits, self.tenant, self.sealer = edits, tenant, sealer
        self._last: tuple[Outcome, list[dict[str, Any]]] | None = None

    def body_for(self, body: bytes, data: dict[str, Any], outcome: Outcome) -> bytes:
        """The body ``outcome``'s view goes upstream as: ``body`` (the request as the
        contract wrote it) when nothing changes it."""
        messages = data["messages"] if outcome.messages is None else to_anthropic(outcome.messages)
        edited, applied = self._cleared(messages, outcome.tokens)
        self._last = (outcome, applied)
        if outcome.messages is None and edited is messages:
            return body
        return orjson.dumps({**data, "messages": edited})

    def _cleared(
        self, messages: list[Message], tokens: int
    ) -> tuple[list[Message], list[dict[str, Any]]]:
        edits, applied = self.edits, []
        if edits.thinking:
            messages, turns, freed = ce.clear_thinking(messages, edits.thinking_keep)
            applied.append(
                {
                    "type": ce.CLEAR_THINKING,
                    "cleared_thinking_turns": turns,
                    "cleared_input_tokens": freed,
                }
            )
        if edits.tools is not None:
            cleared = ce.clear_tool_uses(messages, edits.tools, tokens - _freed(applied))
            if cleared is not None:
                messages, uses, freed = cleared
                applied.append(
                    {
                        "type": ce.CLEAR_TOOLS,
                        "cleared_tool_uses": uses,
                        "cleared_input_tokens": freed,
                    }
                )
        return messages, [a for a in applied if a.get("cleared_input_tokens")]

    def block(self, outcome: Outcome) -> dict[str, Any] | None:
        """The ``compaction`` block for ``outcome``'s view: one that carries a summary,
        under a ``compact_*`` edit; else None."""
        if self.edits.compact is None or outcome.messages is None:
            return None
        if outcome.status not in ("snapshot", "compacted") or outcome.version <= 0:
            return None
        summary = next(
            (
                str(m.get("content"))
                for m in outcome.messages
                if "_message" not in m and "_system" not in m and "_block" not in m
            ),
            None,
        )
        if summary is None:  # elision alone: nothing summarized
            return None
        block = cb.compaction_block(to_anthropic(outcome.messages), self.tenant, self.sealer)
        return {**block, "content": summary}

    def answer_edit(self, outcome: Outcome) -> AnswerEdit | None:
        """How the upstream's answer to ``outcome``'s view is edited; None: not at all."""
        applied = self._last[1] if self._last is not None and self._last[0] is outcome else None
        if applied is None:
            applied = self._cleared(to_anthropic(outcome.messages or []), outcome.tokens)[1]
        return AnswerEdit(self.block(outcome), {"applied_edits": applied})


def _freed(applied: list[dict[str, Any]]) -> int:
    return sum(int(a.get("cleared_input_tokens", 0)) for a in applied)


class AnswerEdit:
    """The answer with the compaction block first and ``context_management`` set."""

    def __init__(self, block: dict[str, Any] | None, management: dict[str, Any]) -> None:
        self.block, self.management = block, management

    def whole(self, body: bytes) -> bytes:
        """A JSON answer (a ``message``) edited; anything else as it came."""
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(message, dict) or message.get("type") != "message":
            return body
        content = message.get("content")
        if self.block is not None and isinstance(content, list):
            message["content"] = [self.block, *content]
        message["context_management"] = self.management
        return orjson.dumps(message)

    async def stream(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        """An event stream edited event by event, as its events complete."""
        pending = b""
        async for chunk in chunks:
            pending += chunk
            if b"\r" in pending:  # CRLF lines read as LF ones, once whole
                if pending.endswith(b"\r"):
                    continue
                pending = pending.replace(b"\r\n", b"\n")
            *events, pending = pending.split(b"\n\n")
            out = b"".join(self._event(e) for e in events if e)
            if out:
                yield out
        if pending:
            yield pending

    def _event(self, event: bytes) -> bytes:
        name = _field(event, b"event: ")
        if name in _BLOCK_EVENTS and self.block is None:
            return event + b"\n\n"
        if name not in (*_BLOCK_EVENTS, b"message_start", b"message_delta"):
            return event + b"\n\n"
        raw = _field(event, b"data: ")
        try:
            data = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError:
            return event + b"\n\n"
        if not isinstance(data, dict):
            return event + b"\n\n"
        if name == b"message_start":
            return event + b"\n\n" + (b"" if self.block is None else _block_events(self.block))
        if name == b"message_delta":
            data["context_management"] = self.management
        elif isinstance(data.get("index"), int):
            data["index"] += 1
        return _sse(name, data)


def _field(event: bytes, prefix: bytes) -> bytes | None:
    for line in event.split(b"\n"):
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
        if line.startswith(prefix.rstrip()):
            return line[len(prefix) - 1 :].strip()
    return None


def _sse(name: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _block_events(block: dict[str, Any]) -> bytes:
    """A compaction block as a stream sends it: opened empty, one delta, closed."""
    start = {"type": "compaction", "content": None}
    delta = {
        "type": "compaction_delta",
        "content": block.get("content"),
        "encrypted_content": block.get("encrypted_content"),
    }
    return (
        _sse(
            b"content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": start},
        )
        + _sse(b"content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        + _sse(b"content_block_stop", {"type": "content_block_stop", "index": 0})
    )


async def paused(carried: Carried, data: dict[str, Any], turn: Turn, outcome: Outcome) -> Response:
    """The answer under ``pause_after_compaction`` for the view ``outcome`` compacted:
    the compaction block alone, ``stop_reason: "compaction"``, no generation upstream."""
    block = carried.block(outcome) or {"type": "compaction", "content": None}
    usage = {
        "input_tokens": outcome.tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    message: dict[str, Any] = {
        "id": "msg_" + secrets.token_hex(12),
        "type": "message",
        "role": "assistant",
        "model": data.get("model"),
        "content": [block],
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": usage,
        "context_management": {"applied_edits": []},
    }
    headers = {k.decode(): v.decode() for k, v in outcome.headers()}
    if data.get("stream") is not True:
        return Response(orjson.dumps(message), headers=headers, media_type="application/json")
    opening = {**message, "content": [], "stop_reason": None}
    closing = {"stop_reason": "compaction", "stop_sequence": None}
    body = (
        _sse(b"message_start", {"type": "message_start", "message": opening})
        + _block_events(block)
        + _sse(
            b"message_delta",
            {
                "type": "message_delta",
                "delta": closing,
                "usage": usage,
                "context_management": message["context_management"],
            },
        )
        + _sse(b"message_stop", {"type": "message_stop"})
    )
    headers["cache-control"] = "no-cache"
    return Response(body, headers=headers, media_type="text/event-stream")
