"""Anthropic's Messages API as the simulator checks and reads it.

``check_messages`` rejects what api.anthropic.com rejects, with its error bodies
(``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``):

* ``model`` and ``max_tokens`` (a positive integer) are required; ``messages`` is a
  non-empty list of ``user`` / ``assistant`` messages, the first from the user, the
  roles alternating;
* every ``tool_use`` is answered by a ``tool_result`` (same id) in the next message,
  a user message, and every ``tool_result`` answers a ``tool_use`` of the message
  before it;
* at most four ``cache_control`` breakpoints (tools, system and messages together);
* every ``thinking`` block carries the signature the simulator gave it (``sign``): a
  block altered by a single byte is rejected; and when the request enables thinking
  and ends inside a tool loop (its last user message answers tool calls), the last
  assistant message must open with a thinking block, as the API requires.

``chat_view`` turns the request into the chat messages the reply rules read (system
text first, tool uses as tool calls, each tool result a tool message).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import orjson

from proxy.simulator.counting import text_of
from proxy.simulator.errors import SimError

_SECRET = b"compaction-proxy simulator thinking signature"
_THINKING = ("thinking", "redacted_thinking")


def anthropic_error(status: int, kind: str, message: str, *, err: str = "request") -> SimError:
    """An error answer in Anthropic's shape."""
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return SimError(status, orjson.dumps(body), kind=err)  # type: ignore[arg-type]


def invalid(message: str, *, structure: bool = False) -> SimError:
    return anthropic_error(
        400, "invalid_request_error", message, err="structure" if structure else "request"
    )


def sign(thinking: str) -> str:
    """The signature of a thinking text (opaque to clients; checked on the way back)."""
    return hmac.new(_SECRET, thinking.encode(), hashlib.sha256).hexdigest()


def blocks(content: object) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def check_messages(body: dict[str, Any], system_turns: bool = False) -> list[dict[str, Any]]:
    """The request's messages, checked as api.anthropic.com checks them. ``system_turns``
    (the ``mid-conversation-system`` beta, which Claude Code asks for): ``system``
    messages may come between the turns; the checks below read the turns around them."""
    _check_fields(body)
    checked = _shaped(body.get("messages"), system_turns)
    messages = [m for m in checked if m["role"] != "system"]
    _check_alternation(messages)
    _check_pairing(messages)
    _check_thinking(body, messages)
    _check_breakpoints(body, checked)
    return checked


def _check_fields(body: dict[str, Any]) -> None:
    """The model and the output budget, as the API requires them."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise invalid("model: Field required")
    budget = body.get("max_tokens")
    if budget is None:
        raise invalid("max_tokens: Field required")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise invalid("max_tokens: Input should be a valid integer greater than or equal to 1")


def _shaped(messages: Any, system_turns: bool) -> list[dict[str, Any]]:
    """``messages``, a list of at least one message, each with a role and a content."""
    if not isinstance(messages, list) or not messages:
        raise invalid(
            "messages: Field required"
            if messages is None
            else "messages: at least one message is required"
        )
    roles = ("user", "assistant", "system") if system_turns else ("user", "assistant")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in roles:
            raise invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise invalid(f"messages.{i}.content: Input should be a valid list")
        for k, block in enumerate(blocks(content)):
            # Like an upstream without context management (llama.cpp, vLLM): a compaction
            # block is not a kind of block it knows. What the proxy must expand.
            if block.get("type") == "compaction":
                raise invalid(
                    f"messages.{i}.content.{k}: Input tag 'compaction' found using 'type' "
                    "does not match any of the expected tags"
                )
    return messages


def _check_alternation(messages: list[dict[str, Any]]) -> None:
    """The turns (``system`` ones apart) start with the user's and alternate."""
    if not messages or messages[0]["role"] != "user":
        raise invalid('messages: first message must use the "user" role', structure=True)
    for i in range(1, len(messages)):
        if messages[i]["role"] == messages[i - 1]["role"]:
            role = messages[i]["role"]
            raise invalid(
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row',
                structure=True,
            )


_MAX_BREAKPOINTS = 4


def _check_breakpoints(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """At most four ``cache_control`` breakpoints in tools, system and messages."""
    tools = body.get("tools")
    places: list[Any] = [*(tools if isinstance(tools, list) else []), *blocks(body.get("system"))]
    places += [b for m in messages for b in blocks(m.get("content"))]
    found = sum(1 for p in places if isinstance(p, dict) and "cache_control" in p)
    if found > _MAX_BREAKPOINTS:
        raise invalid(
            f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}.",
            structure=True,
        )


def _ids(message: dict[str, Any], kind: str, key: str) -> list[str]:
    return [str(b.get(key)) for b in blocks(message.get("content")) if b.get("type") == kind]


def _check_pairing(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        asked = _ids(message, "tool_use", "id") if message["role"] == "assistant" else []
        answered = _ids(message, "tool_result", "tool_use_id")
        if answered:
            _check_answered(messages, i, answered)
        if asked:
            _check_asked(messages, i, asked)


def _check_answered(messages: list[dict[str, Any]], i: int, answered: list[str]) -> None:
    """Message ``i``'s tool results answer the calls of the message before it, a user's."""
    before = _ids(messages[i - 1], "tool_use", "id") if i else []
    extra = [a for a in answered if a not in before]
    if extra or messages[i]["role"] != "user":
        raise invalid(
            f"messages.{i}.content.0: unexpected `tool_use_id` found in `tool_result` "
            f"blocks: {', '.join(extra or answered)}. Each `tool_result` block must "
            "have a corresponding `tool_use` block in the previous message.",
            structure=True,
        )


def _check_asked(messages: list[dict[str, Any]], i: int, asked: list[str]) -> None:
    """Message ``i``'s tool calls are answered by the message after it, when one follows."""
    following = _ids(messages[i + 1], "tool_result", "tool_use_id") if i + 1 < len(messages) else []
    missing = [a for a in asked if a not in following]
    if missing and i + 1 < len(messages):
        raise invalid(
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
            "corresponding `tool_result` block in the next message.",
            structure=True,
        )


def _check_thinking(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        for j, block in enumerate(blocks(message.get("content"))):
            if block.get("type") != "thinking":
                continue
            text, signature = block.get("thinking"), block.get("signature")
            if not isinstance(text, str) or not hmac.compare_digest(
                str(signature or ""), sign(text)
            ):
                raise invalid(
                    f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block",
                    structure=True,
                )
    thinking = body.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    last = messages[-1]
    if not enabled or last["role"] != "user" or not _ids(last, "tool_result", "tool_use_id"):
        return
    i = len(messages) - 2
    first = blocks(messages[i].get("content"))
    found = first[0].get("type") if first else "nothing"
    if found not in _THINKING:
        raise invalid(
            f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{found}`. When `thinking` is enabled, a final `assistant` message must "
            "start with a thinking block (preceeding the lastmost set of `tool_use` and "
            "`tool_result` blocks). We recommend you include thinking blocks from previous "
            "turns. To avoid this requirement, disable `thinking`.",
            structure=True,
        )


def system_text(system: object) -> str:
    """The ``system`` field's text (a string, or text blocks)."""
    return system if isinstance(system, str) else text_of(blocks(system))


def chat_view(
    body: dict[str, Any], messages: list[dict[str, Any]], turns_only: bool = False
) -> list[dict[str, Any]]:
    """The request as chat messages: what the counter reads, and (``turns_only``: without
    the system messages between turns) what the reply rules read."""
    out: list[dict[str, Any]] = []
    system = system_text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        parts = blocks(message.get("content"))
        if message["role"] == "system":
            if not turns_only:
                out.append({"role": "system", "content": system_text(message.get("content"))})
            continue
        if message["role"] == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": _texts(parts)}
            calls = [
                {
                    "id": str(b.get("id")),
                    "type": "function",
                    "function": {
                        "name": str(b.get("name")),
                        "arguments": orjson.dumps(b.get("input", {})).decode(),
                    },
                }
                for b in parts
                if b.get("type") == "tool_use"
            ]
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        for b in parts:
            if b.get("type") == "tool_result":
                content = b.get("content")
                text = content if isinstance(content, str) else text_of(blocks(content))
                out.append(
                    {"role": "tool", "tool_call_id": str(b.get("tool_use_id")), "content": text}
                )
        rest = [b for b in parts if b.get("type") != "tool_result"]
        if rest:
            out.append({"role": "user", "content": _texts(rest)})
    return out


def _texts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text blocks as chat text parts; anything else (images, documents) as a non-text
    part the counter prices flat."""
    out: list[dict[str, Any]] = []
    for b in parts:
        if b.get("type") == "text":
            out.append({"type": "text", "text": str(b.get("text", ""))})
        elif b.get("type") not in ("tool_use", *_THINKING):
            out.append({"type": "image_url"})
    return out


def thinking_text(messages: list[dict[str, Any]]) -> str:
    """The text of the thinking blocks passed back (the model reads them: they count)."""
    return "\n".join(
        str(b.get("thinking", b.get("data", "")))
        for m in messages
        for b in blocks(m.get("content"))
        if b.get("type") in _THINKING
    )


def chat_tools(tools: object) -> list[dict[str, Any]]:
    """Anthropic tool definitions (name, input_schema) as chat tools, for the reply rules."""
    if not isinstance(tools, list):
        return []
    return [
        {
            "type": "function",
            "function": {
                "name": t.get("name"),
                "description": t.get("description"),
                "parameters": t.get("input_schema"),
            },
        }
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("name"), str)
    ]
