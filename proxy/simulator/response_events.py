"""A reply in the Responses API's wire shapes: the ``response`` object and its stream.

As in completion.py, ``created_at`` is fixed and every id derives from the
request, so the same request always gets a byte-identical answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.simulator.completion import CREATED
from proxy.simulator.items import seal
from proxy.simulator.replies import Reply


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer to a Responses request, and what its wire shapes carry with it."""

    tag: str  # from the request's digest: every id of the answer contains it
    model: str
    reply: Reply
    input_tokens: int
    reasoning: str | None  # the reasoning to hand back (encrypted), when asked to reason
    cached_tokens: int = 0  # of input_tokens, a prefix cached (prompt_cache.py)


def output_items(answer: Answer) -> list[dict[str, Any]]:
    """The answer's output: its reasoning, then its function calls or its message.

    Calls issued with reasoning get ids starting ``fcr_``: the simulator then wants
    that reasoning item back before them (items.py), as OpenAI does.
    """
    tag, reply = answer.tag, answer.reply
    out: list[dict[str, Any]] = []
    prefix = "fc"
    if answer.reasoning is not None:
        prefix = "fcr"
        out.append(
            {
                "type": "reasoning",
                "id": f"rs_{tag}",
                "summary": [],
                "encrypted_content": seal(answer.reasoning),
            }
        )
    for k, call in enumerate(reply.tool_calls, start=1):
        out.append(
            {
                "type": "function_call",
                "id": f"{prefix}_{tag}_{k}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    if not reply.tool_calls:
        text = {"type": "output_text", "text": reply.content or "", "annotations": []}
        out.append(
            {
                "type": "message",
                "id": f"msg_{tag}",
                "status": "completed",
                "role": "assistant",
                "content": [{**text, "logprobs": []}],
            }
        )
    return out


def response_object(answer: Answer, body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object for ``answer`` to request ``body``."""
    reply = answer.reply
    cut = reply.finish_reason == "length"
    return {
        "id": f"resp_{answer.tag}",
        "object": "response",
        "created_at": CREATED,
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": answer.model,
        "output": output_items(answer),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning"),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text", {"format": {"type": "text"}}),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": {
            "input_tokens": answer.input_tokens,
            "input_tokens_details": {"cached_tokens": answer.cached_tokens},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": answer.input_tokens + reply.completion_tokens,
        },
        "metadata": body.get("metadata") or {},
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def response_events(response: dict[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    """The event sequence OpenAI streams for ``response``: lifecycle, each output item
    added, its text or arguments in ``chunk_chars`` pieces, done; then completed."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(response["output"]):
        events += _item_events(index, item, chunk_chars)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def _item_events(index: int, item: dict[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "message":
        part = item["content"][0]
        text = part["text"]
        empty = {**part, "text": ""}
        opened = {**item, "status": "in_progress", "content": []}
        deltas = [
            {"type": "response.output_text.delta", **at, "content_index": 0, "delta": piece}
            for piece in _pieces(text, chunk_chars)
        ]
        return [
            {"type": "response.output_item.added", "output_index": index, "item": opened},
            {"type": "response.content_part.added", **at, "content_index": 0, "part": empty},
            *[{**d, "logprobs": []} for d in deltas],
            {
                "type": "response.output_text.done",
                **at,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            },
            {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    if item["type"] == "function_call":
        args = item["arguments"]
        opened = {**item, "status": "in_progress", "arguments": ""}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": opened},
            *[
                {"type": "response.function_call_arguments.delta", **at, "delta": piece}
                for piece in _pieces(args, chunk_chars)
            ],
            {"type": "response.function_call_arguments.done", **at, "arguments": args},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def failed_events(body: dict[str, Any], code: str, message: str) -> list[dict[str, Any]]:
    """A stream that fails before any output: created, in progress, ``response.failed``."""
    opening: dict[str, Any] = {
        "id": "resp_failed",
        "object": "response",
        "created_at": CREATED,
        "status": "in_progress",
        "model": body.get("model"),
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "usage": None,
    }
    failed = {**opening, "status": "failed", "error": {"code": code, "message": message}}
    events = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
        {"type": "response.failed", "response": failed},
    ]
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]
