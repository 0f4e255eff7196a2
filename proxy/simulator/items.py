"""Responses API input items, checked as api.openai.com checks them, read as chat messages.

The checks a compactor most easily breaks, with OpenAI's wording:

* every ``function_call_output`` (``custom_tool_call_output``) answers a call with
  its ``call_id`` earlier in the input, and every call is answered;
* a ``reasoning`` item is followed by the item it produced (not by a user message,
  a tool output or the end of the input);
* a ``function_call`` this simulator issued together with reasoning (its id starts
  ``fcr_``) comes after that reasoning item, in the same turn;
* encrypted reasoning content is exactly what the simulator wrote: one altered
  byte and the item "could not be verified".

``chat_messages`` then reads the items as the chat messages the reply rules and the
prompt count work on (reasoning costs the tokens of its encrypted content).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from proxy.simulator.counting import PromptCounter
from proxy.simulator.errors import SimError, invalid_request

_CALLS = {"function_call": "arguments", "custom_tool_call": "input"}
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_KEY = b"compaction-proxy simulator reasoning"
_PEOPLE = ("user", "system", "developer")


def seal(text: str) -> str:
    """Encrypted reasoning content as the simulator writes it: opaque, and tamper-evident."""
    payload = text.encode()
    tag = hashlib.blake2b(payload, key=_KEY, digest_size=8).hexdigest()
    return base64.b64encode(payload).decode() + "." + tag


def unsealed(content: str) -> str | None:
    payload, _, tag = content.rpartition(".")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    if hashlib.blake2b(raw, key=_KEY, digest_size=8).hexdigest() != tag:
        return None
    return raw.decode("utf-8", "replace")


def _structure(message: str, param: str | None = None, code: str | None = None) -> SimError:
    return invalid_request(message, param=param, code=code, kind="structure")


def check_items(items: list[Any]) -> list[dict[str, Any]]:
    """Raise OpenAI's 400 for an item sequence it would reject; return the items."""
    called: dict[str, int] = {}
    answered: set[str] = set()
    reasoning: str | None = None  # the last reasoning item's id, within this turn
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _structure(f"Invalid type for 'input[{i}]': expected an object.", f"input[{i}]")
        kind = item.get("type", "message")
        _check_following(items, i, kind)
        if kind == "reasoning":
            reasoning = str(item.get("id", ""))
            content = item.get("encrypted_content")
            if content is not None and (not isinstance(content, str) or not unsealed(content)):
                raise _structure(
                    f"The encrypted content for item {reasoning} could not be verified.",
                    code="invalid_encrypted_content",
                )
        elif kind in _CALLS:
            _check_reasoning(item, reasoning)
            called[str(item.get("call_id"))] = i
        elif kind in _OUTPUTS:
            call_id = str(item.get("call_id"))
            if call_id not in called:
                raise _structure(
                    f"No tool call found for function call output with call_id {call_id}.",
                    f"input[{i}]",
                )
            answered.add(call_id)
        if (kind == "message" and item.get("role") in _PEOPLE) or kind in _OUTPUTS:
            reasoning = None
    for call_id in called:
        if call_id not in answered:
            raise _structure(f"No tool output found for function call {call_id}.")
    return items


def _check_following(items: list[Any], i: int, kind: object) -> None:
    if kind != "reasoning":
        return
    after = items[i + 1] if i + 1 < len(items) else None
    ok = isinstance(after, dict) and after.get("type", "message") not in ("reasoning", *_OUTPUTS)
    if ok and isinstance(after, dict) and after.get("type", "message") == "message":
        ok = after.get("role") == "assistant"
    if not ok:
        item_id = items[i].get("id", "")
        raise _structure(
            f"Item '{item_id}' of type 'reasoning' was provided without its required "
            "following item."
        )


def _check_reasoning(item: dict[str, Any], reasoning: str | None) -> None:
    item_id = str(item.get("id", ""))
    if not item_id.startswith("fcr_"):
        return
    needed = "rs_" + item_id[4:].rsplit("_", 1)[0]
    if reasoning != needed:
        raise _structure(
            f"Item '{item_id}' of type '{item.get('type')}' was provided without its required "
            f"'reasoning' item: '{needed}'."
        )


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part
    )


def chat_messages(instructions: object, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items as chat messages: calls as an assistant's ``tool_calls``, outputs as
    ``tool`` messages, reasoning left out (``reasoning_tokens`` counts it)."""
    out: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type", "message")
        last = out[-1] if out else None
        if kind == "message":
            role = item.get("role", "user")
            text = _text(item.get("content"))
            if role == "assistant" and last is not None and last["role"] == "assistant":
                last["content"] = f"{last.get('content') or ''}{text}"
            else:
                out.append({"role": role, "content": text})
        elif kind in _CALLS:
            call = {
                "id": str(item.get("call_id")),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get(_CALLS[kind], "")},
            }
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind in _OUTPUTS:
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output)
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id")), "content": text})
    return out


def reasoning_tokens(items: list[dict[str, Any]], counter: PromptCounter) -> int:
    """What the reasoning items passed back cost: the reasoning they carry."""
    total = 0
    for item in items:
        if item.get("type") == "reasoning" and isinstance(item.get("encrypted_content"), str):
            total += counter.text(unsealed(item["encrypted_content"]) or "")
    return total
