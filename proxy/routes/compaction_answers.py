"""The proxy's own answers under OpenAI's compaction contract (compaction_items.py):
a ``response`` (JSON, or its event stream) whose output is one ``compaction`` item,
for a ``compaction_trigger``; a ``response.compaction`` for ``/responses/compact``.
Each carries the ``X-Compaction-*`` headers of the view it compacted."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from proxy.config import Settings
from proxy.core.outcome import Outcome, Turn
from proxy.core.session import session_key
from proxy.routes.compaction_items import (
    Local,
    Sealer,
    compaction_item,
    created_at,
    user_messages,
)


async def answer(
    kind: Local, data: dict[str, Any], settings: Settings, turn: Turn, outcome: Outcome
) -> Response:
    """The answer to ``data`` (a trigger's request, or ``/responses/compact``'s) for the
    view ``outcome`` the pipeline compacted ``turn`` to."""
    messages = outcome.messages if outcome.messages is not None else turn.chat["messages"]
    key = session_key(turn.tenant, turn.session_header, turn.chat["messages"])
    item = compaction_item(
        messages, turn.tenant, (f"{key.source[0]}:{key.session}", outcome.version), Sealer(settings)
    )
    usage = {
        "input_tokens": outcome.tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": outcome.tokens,
    }
    headers = {k.decode(): v.decode() for k, v in outcome.headers()}
    common = {"id": "resp_" + item["id"].removeprefix("cmp_"), "created_at": created_at()}
    if kind == "compact":
        raw = data.get("input")
        items = raw if isinstance(raw, list) else [_user(raw)] if isinstance(raw, str) else []
        output = [*user_messages(items), item]
        body = {**common, "object": "response.compaction", "output": output, "usage": usage}
        return Response(orjson.dumps(body), headers=headers, media_type="application/json")
    response = {
        **common,
        "object": "response",
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": data.get("instructions"),
        "model": data.get("model"),
        "output": [item],
        "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "store": data.get("store", True),
        "tool_choice": data.get("tool_choice", "auto"),
        "tools": data.get("tools", []),
        "usage": usage,
        "metadata": data.get("metadata") or {},
    }
    if data.get("stream") is not True:
        return Response(orjson.dumps(response), headers=headers, media_type="application/json")
    headers["cache-control"] = "no-cache"
    return Response(_events(response), headers=headers, media_type="text/event-stream")


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _events(response: dict[str, Any]) -> bytes:
    """The stream of ``response``: created, in progress, its one item added and done,
    completed (a compaction item has no deltas)."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    item = response["output"][0]
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return b"".join(
        b"event: "
        + e["type"].encode()
        + b"\ndata: "
        + orjson.dumps({**e, "sequence_number": n})
        + b"\n\n"
        for n, e in enumerate(events)
    )
