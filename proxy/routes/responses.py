"""``POST /v1/responses``: the pipeline's steps with the Responses API's shapes (``RESPONSES``).

A stateless request (its whole conversation in ``input``) is compacted like a
chat: its items plan as chat messages (items.py), so counting, the session,
the snapshot, the plan, the summary (asked of the upstream's chat completions)
and the rebuild are the pipeline's own (``pipeline.compacted_view``);
the rebuilt view goes back upstream as input items: ``instructions`` untouched,
the handoff summary as input messages, the rest of the client's items verbatim.

A request that chains on ``previous_response_id`` (or names a ``conversation``)
has its history at the provider, out of the proxy's sight: it is forwarded
untouched, ``X-Compaction-Status: bypassed``. So is any request under
``X-Compaction: off``.

Output items of every answer relayed are remembered per tenant (upstream/output_items.py),
and an ``item_reference`` in ``input`` (the Vercel AI SDK's, any ``store: true``
client's) reads as the item it names when counting and summarizing
(compaction/references.py); it goes upstream as it came, for the upstream resolves it.

Overflow recovery is the pipeline's step 10 with Responses' shapes: a
400 ``context_length_exceeded``, or a stream whose first event after its
lifecycle preamble is ``response.failed`` with a context error (recover.py),
compacts harder against the learned window and retries once; a too-large
``max_output_tokens`` is lowered instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, cast

import orjson

from proxy.config import Settings
from proxy.core.outcome import Outcome
from proxy.errors import InvalidRequest
from proxy.routes.compaction_answers import answer
from proxy.routes.compaction_items import admit
from proxy.routes.items import Item, check_count, references, to_items, to_messages
from proxy.routes.parse import DEFAULT_MAX_MODEL_BYTES, check_depth, load_request, written
from proxy.routes.summary_bodies import responses_summary
from proxy.routes.tool_shapes import RESPONSES_TOOL
from proxy.types import ChatMessage, ChatRequest
from proxy.upstream.api import Api, Contract, SummaryBody, ToolShape
from proxy.upstream.calibrate import find_input_tokens
from proxy.upstream.overflow import Overflow
from proxy.upstream.stream_head import error_event

# Fields that put the conversation at the provider, beyond what the request shows.
_CHAINED = ("previous_response_id", "conversation")


def _untouched(data: dict[str, Any], control: str) -> bool:
    """A chained call (its history at the provider), or one under ``X-Compaction: off``."""
    return control == "off" or any(data.get(key) for key in _CHAINED)


def _read(
    body: bytes, max_messages: int, max_model_bytes: int
) -> tuple[dict[str, Any], ChatRequest]:
    data = parse_responses_request(body, max_messages, max_model_bytes)  # items, here
    return data, chat_view(data)


def parse_responses_request(
    body: bytes, max_items: int, max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES
) -> dict[str, Any]:
    """The request as a JSON object with a model name of at most ``max_model_bytes``;
    ``input``, when a list, of at most ``max_items`` objects. What the items hold is the
    upstream's to judge (items.py reads it defensively)."""
    data = load_request(body, max_model_bytes)
    items = data.get("input")
    if isinstance(items, list):
        check_count(len(items), max_items)
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidRequest(f"input[{i}] must be an object.", param=f"input[{i}]")
    check_depth(data)
    return data


def chat_view(data: dict[str, Any], found: Mapping[str, Item] | None = None) -> ChatRequest:
    """The request as the chat steps read it: the items as messages (an
    ``item_reference`` as the item ``found`` holds for its id), and the fields that size
    it (tools, the output format, the output budget)."""
    raw = data.get("input")
    items: list[Item] = []
    if isinstance(raw, str):
        items = [{"type": "message", "role": "user", "content": raw}]
    elif isinstance(raw, list):
        items = raw
    chat: dict[str, Any] = {
        "model": data["model"],
        "messages": to_messages(data.get("instructions"), items, found) if items else [],
    }
    if data.get("stream") is True:
        chat["stream"] = True
    budget = data.get("max_output_tokens")
    if isinstance(budget, int) and not isinstance(budget, bool):
        chat["max_tokens"] = budget
    if isinstance(data.get("tools"), list):
        chat["tools"] = data["tools"]
    text = data.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        chat["response_format"] = text["format"]
    return cast(ChatRequest, chat)


def outgoing_body(body: bytes, data: dict[str, Any], outcome: Outcome) -> bytes:
    """The client's own ``body`` when the view is the history as sent, else the request
    (``data``) with the rebuilt view as its ``input``."""
    if outcome.messages is None:
        return body
    return orjson.dumps({**data, "input": to_items(outcome.messages)})


def _lower_output(body: bytes, verdict: Overflow) -> bytes | None:
    """The body with ``max_output_tokens`` lowered to what the model allows; None if
    that changes nothing."""
    data = orjson.loads(body)
    current = data.get("max_output_tokens")
    current = current if isinstance(current, int) and not isinstance(current, bool) else 0
    allowed = verdict.limit or current // 2
    if allowed <= 0 or (current and allowed >= current):
        return None
    return orjson.dumps({**data, "max_output_tokens": allowed})


def _stream_error(error: dict[str, Any]) -> bytes:
    """An error as a Responses stream carries one: an ``error`` event, the first the
    client sees (a held stream fails before any other event went out)."""
    event = {
        "type": "error",
        "code": error.get("code"),
        "message": error.get("message"),
        "param": error.get("param"),
        "sequence_number": 0,
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


class ResponsesApi(Api):
    """The Responses API: its items plan as chat messages (items.py), its answers' output
    items are kept for the references that name them, and OpenAI's compaction contract
    (compaction_items.py) applies to its requests (the module's doc)."""

    name = "responses"
    path = "responses"
    names_items = True
    keeps_items = True
    recall_tool: ToolShape | None = RESPONSES_TOOL
    compacts = False  # the contract of /responses/compact (ResponsesCompactApi)
    parse = staticmethod(_read)
    body_for = staticmethod(outgoing_body)
    lower_output = staticmethod(_lower_output)
    prompt_tokens = staticmethod(find_input_tokens)
    stream_failure = staticmethod(error_event)
    stream_error = staticmethod(_stream_error)
    untouched = staticmethod(_untouched)
    resolved = staticmethod(chat_view)
    summary_body = staticmethod(responses_summary)

    def references(self, data: dict[str, Any]) -> list[str]:
        return references(data.get("input"))

    def contract(
        self,
        body: bytes,
        data: dict[str, Any],
        chat: ChatRequest,
        tenants: tuple[str, ...],
        settings: Settings,
    ) -> Contract:
        """OpenAI's compaction contract (compaction_items.py) for ``/responses``, or for
        ``/responses/compact`` when the class ``compacts``."""
        admitted = admit(data, tenants, settings, self.compacts)  # its carried items too
        if not admitted.changed:
            return Contract(body, data, chat, untouched=admitted.untouched)
        new = admitted.data
        if admitted.local is not None and any(new.get(key) for key in _CHAINED):
            raise InvalidRequest(
                "This proxy compacts only a conversation sent whole: not one chained with "
                "'previous_response_id' or 'conversation' (upstream.compaction: proxy).",
                param="previous_response_id",
            )
        if admitted.local is not None and not new.get("input"):
            raise InvalidRequest("Invalid 'input': nothing to compact.", param="input")
        # context_management's threshold, against the body's size (a rough token estimate)
        force = admitted.threshold is not None and len(body) // 4 > admitted.threshold
        reply = None if admitted.local is None else partial(answer, admitted.local, new, settings)
        # written(): a carried payload may nest deeper than orjson writes back
        return Contract(written(new), new, chat_view(new), force=force, answer=reply)


class ResponsesCompactApi(ResponsesApi):
    """``POST /v1/responses/compact``: the upstream's (passthrough), else the proxy's own
    answer."""

    name = "responses_compact"
    path = "responses/compact"
    recall_tool = None
    compacts = True

    def summary_body(
        self, data: dict[str, Any], messages: list[ChatMessage], max_tokens: int
    ) -> SummaryBody:
        """None: the proxy answers this request itself; no live request to summarize as."""
        return None


RESPONSES = ResponsesApi()
RESPONSES_COMPACT = ResponsesCompactApi()
