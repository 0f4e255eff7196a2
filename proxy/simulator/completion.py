"""A reply in OpenAI's wire shapes: ``chat.completion`` and ``chat.completion.chunk``.

``created`` is fixed so that the same request always gets a byte-identical
answer; tests and benchmark diffs rely on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.simulator.replies import Reply

CREATED = 1700000000


def usage(prompt_tokens: int, completion_tokens: int, cached: int | None = None) -> dict[str, Any]:
    """A chat usage object; with ``cached``, its ``prompt_tokens_details`` as OpenAI's."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
    return out


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer to a chat request: the reply, and what its wire shapes carry with it."""

    id: str
    model: str
    reply: Reply
    prompt_tokens: int
    cached_tokens: int = 0  # of prompt_tokens, a prefix cached (prompt_cache.py)

    def usage(self) -> dict[str, Any]:
        return usage(self.prompt_tokens, self.reply.completion_tokens, self.cached_tokens)


def completion_body(completion: Completion) -> dict[str, Any]:
    reply = completion.reply
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ]
    return {
        "id": completion.id,
        "object": "chat.completion",
        "created": CREATED,
        "model": completion.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": completion.usage(),
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def completion_chunks(
    completion: Completion, *, chunk_chars: int, include_usage: bool
) -> list[dict[str, Any]]:
    """The chunk sequence OpenAI streams for ``completion`` (without the ``[DONE]`` line).

    Role first, then content in ``chunk_chars`` pieces, or per tool call one
    delta with id, type and name followed by its arguments in pieces; then the
    finish reason; then, if asked, a usage chunk with no choices. With
    ``include_usage`` every other chunk carries ``"usage": null``, as OpenAI's do.
    """
    completion_id, model, reply = completion.id, completion.model, completion.reply

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            out["usage"] = None
        return out

    # A tool-call reply opens with null content, a text reply with "".
    opening = "" if reply.content is not None else None
    chunks = [chunk({"role": "assistant", "content": opening, "refusal": None})]
    if reply.content:
        chunks += [chunk({"content": piece}) for piece in _pieces(reply.content, chunk_chars)]
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(call.arguments, chunk_chars)
        ]
    chunks.append(chunk({}, reply.finish_reason))
    if include_usage:
        chunks.append(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": model,
                "choices": [],
                "usage": completion.usage(),
            }
        )
    return chunks
