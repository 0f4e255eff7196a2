"""Anthropic Messages <-> the chat messages the compaction steps plan over.

The planner cuts only at group starts (a message plus the tool results after it), so
a Messages request maps onto chat groups that keep what Anthropic requires together:

* ``system`` (a string or text blocks) is a leading system message that stands for no
  message: it stays in the request's own field, byte for byte, never rewritten;
* a user message is one ``user`` message (text as text parts, images as images,
  anything else counted as its JSON); one that answers tool calls is one ``tool``
  message per ``tool_result`` block, its other blocks (text, a system reminder)
  riding on the last of them: results never start a group, so a ``tool_use`` is
  never separated from its ``tool_result``;
* a ``system`` message between turns (Claude Code's ``mid-conversation-system`` beta)
  rides on the message before it (``_after``), kept or summarized with it;
* an assistant message is one ``assistant`` message, its ``tool_use`` blocks as
  ``tool_calls`` and every other block (``thinking`` and ``redacted_thinking`` with
  their signatures, server tool blocks) counted as its JSON: a turn is kept whole or
  summarized whole, and the newest group (the latest assistant turn of a tool loop
  and its results) is always kept.

Each chat message carries the client's message under ``_message`` (of a message's
results only the first: the others name their block, ``_block``, of that message); the
counter, transcript and identifier check never read it, nor do the digests (digest.py's
``neutral``): they read the chat message, so a turn digests as it would on chat and a
snapshot crosses APIs; the blocks chat has no word for ride in it as their JSON, and an
image with its ``source``, so the digests still tell turns apart. ``to_anthropic`` turns rebuilt
messages back into the request's ``messages``: each client message verbatim, the same
object, once (an elided result's ``tool_result`` content replaced by the placeholder
in a copy), and the messages the proxy wrote (the handoff, an acknowledgement, a
trim marker) as text turns, a system-role one as a user turn. Two neighbours of one
role are merged into one message, so user and assistant still alternate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import orjson

from proxy.types import ChatMessage, ToolCall

Message = dict[str, Any]


class BlockMessage(ChatMessage, total=False):
    """A chat message standing for the client's ``_message`` (for a tool result, its
    block ``_block``); ``_system``: the request's ``system`` field."""

    _message: Message
    _block: int
    _system: bool
    _after: list[Message]  # system messages between turns that follow it


def blocks_of(content: object) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def to_chat(system: object, messages: Sequence[Message]) -> list[ChatMessage]:
    """The chat messages ``system`` and ``messages`` plan as."""
    out: list[BlockMessage] = []
    if isinstance(system, str) and system:
        out.append(BlockMessage(role="system", content=system, _system=True))
    elif isinstance(system, list) and system:
        out.append(BlockMessage(role="system", content=_parts(blocks_of(system)), _system=True))
    names: dict[str, str] = {}
    for message in messages:
        blocks = blocks_of(message.get("content"))
        if message.get("role") == "system" and out and not out[-1].get("_system"):
            _follows(out[-1], message, blocks)
            continue
        if message.get("role") == "system":  # before any turn: pinned, as the field is
            out.append(BlockMessage(role="system", content=_parts(blocks), _message=message))
            continue
        if message.get("role") == "assistant":
            out.append(_assistant(message, blocks, names))
            continue
        results = [i for i, b in enumerate(blocks) if b.get("type") == "tool_result"]
        if not results:
            out.append(BlockMessage(role="user", content=_parts(blocks), _message=message))
            continue
        out.extend(_tool_results(message, blocks, results, names))
    return cast(list[ChatMessage], out)


def _tool_results(
    message: Message, blocks: list[dict[str, Any]], results: list[int], names: dict[str, str]
) -> list[BlockMessage]:
    """A user message whose ``blocks`` hold tool results (at ``results``) as one tool
    message each, its other blocks riding on the last; ``names``: each call's tool."""
    out: list[BlockMessage] = []
    others = [b for b in blocks if b.get("type") != "tool_result"]
    for n, i in enumerate(results):
        block = blocks[i]
        call_id = str(block.get("tool_use_id", ""))
        parts = _parts(blocks_of(block.get("content")))
        if n == len(results) - 1:
            parts += _parts(others)
        result = BlockMessage(role="tool", tool_call_id=call_id, content=parts, _block=i)
        if n == 0:  # the later results of the message are its (hashed once, not each)
            result["_message"] = message
        if call_id in names:  # the elision placeholder names the tool
            result["name"] = names[call_id]
        out.append(result)
    return out


def _follows(before: BlockMessage, message: Message, blocks: list[dict[str, Any]]) -> None:
    """A system message between turns (Claude Code's ``mid-conversation-system`` beta)
    rides on the message before it: never a group of its own, so never a cut's first
    message, and kept or summarized with the turn it comments on."""
    before.setdefault("_after", []).append(message)
    content = before.get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    before["content"] = [*parts, *_parts(blocks)]


def _assistant(
    message: Message, blocks: list[dict[str, Any]], names: dict[str, str]
) -> BlockMessage:
    parts: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for block in blocks:
        if block.get("type") == "tool_use":
            call_id, name = str(block.get("id", "")), str(block.get("name", ""))
            names[call_id] = name
            arguments = orjson.dumps(block.get("input", {})).decode()
            calls.append(
                ToolCall(
                    id=call_id, type="function", function={"name": name, "arguments": arguments}
                )
            )
        else:
            parts.extend(_parts([block]))
    out = BlockMessage(role="assistant", content=parts, _message=message)
    if calls:
        out["tool_calls"] = calls
    return out


def _parts(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks as chat content parts: text as text, images as images, anything else
    (thinking, documents, server tool blocks) counted as its JSON and never read."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":  # its source: the digests tell two images apart
            image = {"detail": "auto"}
            parts.append({"type": "image_url", "image_url": image, "source": block.get("source")})
        else:
            parts.append({"type": "item", "item": block})
    return parts


def to_anthropic(messages: Sequence[ChatMessage]) -> list[Message]:
    """The request's ``messages`` for rebuilt chat ``messages`` (see the module's doc)."""
    out: list[Message] = []
    sources: list[int | None] = []  # id() of the client message each entry is, if any
    source: Message | None = None
    for chat in messages:
        message = cast(BlockMessage, chat)
        if message.get("_system"):
            continue
        if "_block" in message and "_message" not in message and source is not None:
            _with_result(out, source, message)  # a later result of the same message
            for after in message.get("_after", ()):
                out.append(after)
                sources.append(id(after))
            continue
        source = message.get("_message")
        if source is None:  # the proxy's own: a handoff, an acknowledgement, a marker
            role = "assistant" if message["role"] == "assistant" else "user"
            text = message.get("content")
            written = {"role": role, "content": text if isinstance(text, str) else ""}
            _append(out, sources, written, None)
            continue
        if not sources or sources[-1] != id(source):
            _append(out, sources, source, id(source))
        if message["role"] == "tool":
            _with_result(out, source, message)
        for after in message.get("_after", ()):
            out.append(after)
            sources.append(id(after))
    return out


def _append(
    out: list[Message], sources: list[int | None], message: Message, source: int | None
) -> None:
    """``message`` after ``out``, merged into the last entry when both have one role."""
    if out and out[-1]["role"] == message["role"]:
        merged = {
            **out[-1],
            "content": blocks_of(out[-1].get("content")) + blocks_of(message.get("content")),
        }
        out[-1] = merged
        if source is not None:  # its later results find it here
            sources[-1] = source
        return
    out.append(message)
    sources.append(source)


def _with_result(out: list[Message], source: Message, message: BlockMessage) -> None:
    """The last entry with the result ``message`` stands for as it goes upstream: the
    client's block as it was, or (elided) in a copy whose content is the placeholder."""
    content = message.get("content")
    if not isinstance(content, str):  # not elided: the client's block as it was
        return
    index = message.get("_block", -1)
    current = out[-1]
    blocks = blocks_of(current.get("content"))
    if current is source:
        blocks = list(blocks)
    # the block's position in the (possibly merged) entry: from its end, as merging
    # only ever puts the proxy's text before the client's blocks
    offset = len(blocks) - len(blocks_of(source.get("content")))
    at = offset + index
    if 0 <= at < len(blocks) and blocks[at].get("type") == "tool_result":
        blocks[at] = {**blocks[at], "content": content}
        out[-1] = {**current, "content": blocks}
