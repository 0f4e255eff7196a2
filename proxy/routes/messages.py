"""``POST /v1/messages``: the pipeline's steps with Anthropic's Messages API (``MESSAGES``).

A request (its whole conversation in ``messages``, as Claude Code and the Anthropic
SDKs send it) is compacted like a chat: its messages plan as chat groups
(messages_chat.py), so counting, the session, the snapshot, the plan, the summary and
the rebuild are the pipeline's own; the rebuilt view goes back upstream as Messages:
``system`` untouched, the handoff summary as a user turn (with an assistant
acknowledgement where alternation needs one), every kept message the client's own,
thinking blocks and ``cache_control`` breakpoints included.

The session: the session header, else Claude Code's session id in ``metadata.user_id``
(core/session.py), else derived like a chat's. The tenant: ``x-api-key`` or
``Authorization``. ``anthropic-version`` and ``anthropic-beta`` go upstream as sent.

Overflow recovery is the pipeline's step 10 with Anthropic's shapes: "prompt is too
long: N tokens > M maximum" compacts against the learned window and retries once;
"input length and `max_tokens` exceed context limit: P + R > W" with room for at least
half the answer asked for lowers ``max_tokens`` to ``W - P`` instead; either as a 400
or as a stream's first ``error`` event. Usage (``input_tokens`` plus the cache's read
and creation tokens) calibrates the counts.

The proxy's own errors on this route are in Anthropic's shape (``error_body``).

Anthropic's own ``context_management``: ``upstream.compaction`` ``passthrough`` (``auto``
before api.anthropic.com) sends it upstream as sent (its clearing edits, such as the
``clear_thinking_*`` Claude Code sends with every request, apply there to the view the
proxy compacted; a request with a ``compact_*`` edit goes untouched, ``bypassed``: not
compacted twice); ``proxy`` (``auto`` before any other upstream) carries the edits out
(``contract``: context_edits.py, compaction_blocks.py, messages_answers.py).
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from typing import Any, cast

import orjson

from proxy.config import Settings
from proxy.core.outcome import Outcome
from proxy.errors import InvalidRequest, ProxyError
from proxy.routes import compaction_blocks as cb
from proxy.routes import context_edits as ce
from proxy.routes.compaction_items import Sealer, passes_through
from proxy.routes.messages_answers import Carried, paused
from proxy.routes.messages_chat import to_anthropic, to_chat
from proxy.routes.parse import check_depth, load_request
from proxy.routes.summary_bodies import messages_summary
from proxy.routes.tool_shapes import MESSAGES_TOOL
from proxy.types import ChatRequest
from proxy.upstream.api import Api, Contract
from proxy.upstream.overflow import Overflow
from proxy.upstream.stream_head import error_event

_USAGE = {
    key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*(\d{1,9})')
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
}
_ROLES = ("user", "assistant", "system")  # system: between turns, a beta Claude Code uses
# The proxy's error types as Anthropic names them.
_ERROR_TYPES = {
    "server_error": "api_error",
    "upstream_error": "api_error",
    "requests": "rate_limit_error",
}


def _read(
    body: bytes, max_messages: int, max_model_bytes: int
) -> tuple[dict[str, Any], ChatRequest]:
    data = load_request(body, max_model_bytes)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: Field required", param="messages")
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"'messages' has {len(messages)} messages; this proxy accepts at most {max_messages}.",
            param="messages",
        )
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in _ROLES or not isinstance(content, (str, list)):
            where = f"messages.{i}"
            raise InvalidRequest(
                f"{where} must be an object with a 'role' of user or assistant and a "
                "'content' string or array of blocks.",
                param=where,
            )
        if isinstance(content, list) and not all(isinstance(b, dict) for b in content):
            raise InvalidRequest(
                f"messages.{i}.content must hold block objects.", param=f"messages.{i}"
            )
    check_depth(data)
    return data, chat_view(data)


def chat_view(data: dict[str, Any]) -> ChatRequest:
    """The request as the chat steps read it: ``system`` and the messages as chat
    messages, and the fields that size it (tools, the output budget)."""
    chat: dict[str, Any] = {
        "model": data["model"],
        "messages": to_chat(data.get("system"), data["messages"]),
    }
    if data.get("stream") is True:
        chat["stream"] = True
    budget = data.get("max_tokens")
    if isinstance(budget, int) and not isinstance(budget, bool):
        chat["max_tokens"] = budget
    if isinstance(data.get("tools"), list):
        chat["tools"] = data["tools"]
    return cast(ChatRequest, chat)


def outgoing_body(body: bytes, data: dict[str, Any], outcome: Outcome) -> bytes:
    """The client's own ``body`` when the view is the history as sent, else the request
    (``data``, its ``system`` untouched) with the rebuilt view as its ``messages``."""
    if outcome.messages is None:
        return body
    return orjson.dumps({**data, "messages": to_anthropic(outcome.messages)})


def as_budget(verdict: Overflow) -> Overflow:
    """Anthropic's "input length and `max_tokens` exceed context limit: P + R > W" with
    room for at least half the answer asked for (``W - P >= R / 2``) is a refusal of the
    output budget: ``max_tokens`` becomes ``W - P``. With less room, a shorter answer
    would not do: it is an overflow, and the history is compacted."""
    limit, prompt, asked = verdict.limit, verdict.prompt_tokens, verdict.completion_tokens
    if verdict.kind != "overflow" or limit is None or prompt is None or not asked:
        return verdict
    if (limit - prompt) * 2 < asked:
        return verdict
    return replace(verdict, kind="output_budget", limit=limit - prompt, requested=asked)


def _lower_output(body: bytes, verdict: Overflow) -> bytes | None:
    """The body with ``max_tokens`` lowered to what the model allows; None if unchanged."""
    data = orjson.loads(body)
    current = data.get("max_tokens")
    current = current if isinstance(current, int) and not isinstance(current, bool) else 0
    allowed = verdict.limit or current // 2
    if allowed <= 0 or (current and allowed >= current):
        return None
    return orjson.dumps({**data, "max_tokens": allowed})


def prompt_tokens(chunk: bytes) -> int | None:
    """The prompt's tokens in an answer: ``input_tokens`` plus what the prompt cache
    read and wrote (Anthropic counts those apart)."""
    if b"input_tokens" not in chunk:
        return None
    found = {key: pattern.search(chunk) for key, pattern in _USAGE.items()}
    if found["input_tokens"] is None:
        return None
    return sum(int(m.group(1)) for m in found.values() if m is not None)


def _stream_error(error: dict[str, Any]) -> bytes:
    """An error as a Messages stream carries one: an ``error`` event."""
    kind = error.get("type") if isinstance(error.get("type"), str) else "api_error"
    inner = {"type": kind, "message": error.get("message")}
    event = {"type": "error", "error": inner}
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def error_body(error: ProxyError) -> bytes:
    """The proxy's own error (a 400 it refuses, a 502 when the upstream is unreachable)
    in Anthropic's shape, which the Anthropic SDKs and Claude Code read."""
    overloaded = error.code == "server_overloaded"  # Anthropic's 529 word for a 503's
    kind = "overloaded_error" if overloaded else _ERROR_TYPES.get(error.type, error.type)
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def _untouched(data: dict[str, Any], control: str) -> bool:
    """A request whose ``context_management`` asks the upstream to compact it
    (``compact_*`` edits): compacted there, not twice."""
    management = data.get("context_management")
    edits = management.get("edits") if isinstance(management, dict) else None
    if not isinstance(edits, list):
        return False
    return any(isinstance(e, dict) and str(e.get("type", "")).startswith("compact") for e in edits)


def _contract(
    body: bytes, data: dict[str, Any], tenants: tuple[str, ...], settings: Settings
) -> Contract | None:
    """A request with ``context_management`` or ``compaction`` blocks, when the proxy
    carries them out (messages_answers.py): those left out, its edits on the way out and
    back, a ``compact_*`` edit's trigger its own, under ``pause_after_compaction`` (past
    that trigger, in bytes at four a token) answered by the proxy."""
    raw = data.get("context_management")
    edits = ce.read_edits(raw) if raw is not None else ce.Edits()
    new = {k: v for k, v in data.items() if k != "context_management"}
    sealer = Sealer(settings)
    if cb.carries_compaction(body, data["messages"]):
        new["messages"] = cb.expanded(data["messages"], tenants, sealer)
        check_depth(new)
    carried, compact = Carried(edits, tenants[0], sealer), edits.compact
    trigger = None if compact is None else compact.trigger
    pause = compact is not None and compact.pause and len(body) // 4 >= compact.trigger
    answer = partial(paused, carried, new) if pause else None
    chat = chat_view(new)
    return Contract(orjson.dumps(new), new, chat, False, pause, answer, carried, trigger)


class MessagesApi(Api):
    """Anthropic's Messages API: ``system`` and the messages plan as chat messages
    (messages_chat.py); a request whose ``compact_*`` edits ask the upstream to compact it
    goes untouched; an overflow stated with room for half the answer is a budget refusal."""

    name = "messages"
    path = "messages"
    recall_tool = MESSAGES_TOOL
    parse = staticmethod(_read)
    body_for = staticmethod(outgoing_body)
    lower_output = staticmethod(_lower_output)
    prompt_tokens = staticmethod(prompt_tokens)
    stream_failure = staticmethod(error_event)
    stream_error = staticmethod(_stream_error)
    untouched = staticmethod(_untouched)
    as_budget = staticmethod(as_budget)
    summary_body = staticmethod(messages_summary)

    def contract(
        self,
        body: bytes,
        data: dict[str, Any],
        chat: ChatRequest,
        tenants: tuple[str, ...],
        settings: Settings,
    ) -> Contract | None:
        """Anthropic's ``context_management`` carried out by the proxy (``upstream.compaction``
        ``proxy``, or ``auto`` before anything but api.anthropic.com); None: as it came."""
        if "context_management" not in data and b'"compaction"' not in body:
            return None  # the common case, in one dict look and one byte search
        if passes_through(settings, "api.anthropic.com"):
            return None  # a compact_* edit goes untouched (``untouched``), the rest as sent
        if "context_management" not in data and not cb.carries_compaction(body, data["messages"]):
            return None
        return _contract(body, data, tenants, settings)


MESSAGES = MessagesApi()
