"""Responses API input items <-> the chat messages the compaction steps plan over.

The planner, counter, summarizer and rebuilder work on chat messages, and a
Responses request's ``input`` items map onto them group for group:

* a ``message`` item from the user, system or developer is one message of that role;
* a run of the model's own items (``reasoning``, an assistant ``message``,
  ``function_call``, ``custom_tool_call``, any other ``*_call``) is one assistant
  message, calls as ``tool_calls``: a reasoning item stays with the call or
  message it precedes, since no cut falls inside a message;
* a ``function_call_output`` or ``custom_tool_call_output`` is one ``tool`` message
  (a result: never a group start, so it stays with its call, and it may be elided);
* any other ``*_output`` item joins the message before it.

Each message carries the items it stands for under ``_items`` (a key the counter,
the summarizer, the identifier check and the digests never read: digests read the
chat message, so a turn digests as it would on chat or Messages and a snapshot crosses
APIs, while the items chat has no word for ride in it as their JSON and an image with
its source, so a snapshot applies only while those exact turns come first). ``to_items`` turns the
rebuilt messages back into input: the client's items verbatim (the same objects,
encrypted reasoning included, never altered), the handoff summary as input
messages, and an elided output as its item with the placeholder for ``output``.

Parts the model reads but no text shows (encrypted reasoning, images in files,
hosted tool calls) are counted as their JSON, so the estimate errs high.

An ``item_reference`` (a client with ``store: true`` sends an earlier answer back by
its id) plans as the output item the proxy relayed under that id, when it has it
(compaction/references.py looks them up): counted and summarized as that item, and
sent on as the reference, which the upstream resolves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from proxy.errors import InvalidRequest
from proxy.types import UNSEEN_ITEM, ChatMessage, ToolCall

Item = dict[str, Any]

_CALL_TYPES = ("function_call", "custom_tool_call")
# Outputs that stand alone as tool results, and whose output the proxy may elide.
RESULT_TYPES = ("function_call_output", "custom_tool_call_output")
_PEOPLE = ("user", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")


class ItemMessage(ChatMessage, total=False):
    """A chat message standing for ``_items`` of a Responses request's input."""

    _items: list[Item]


def to_messages(
    instructions: object, items: Sequence[Item], found: Mapping[str, Item] | None = None
) -> list[ChatMessage]:
    """The chat messages ``items`` (after ``instructions``, if any) plan as.

    ``instructions`` become a leading system message (pinned, never summarised) that
    stands for no item: they stay in the request's own field. An ``item_reference``
    reads as the item ``found`` holds for its id (an output the proxy relayed), and
    stands for the reference itself; one not found reads as an ``unseen_item`` part,
    which the counter prices at ``UNSEEN_ITEM_TOKENS`` and the transcript names.
    """
    out: list[ItemMessage] = []
    if isinstance(instructions, str) and instructions:
        out.append(ItemMessage(role="system", content=instructions, _items=[]))
    elif instructions:
        out.append(ItemMessage(role="system", content=[_opaque(instructions)], _items=[]))
    names: dict[str, str] = {}
    run: ItemMessage | None = None  # the model's items since the last other message
    for item in items:
        shown = _shown(item, found)
        kind = shown.get("type", "message")
        role = shown.get("role")
        if kind == "message" and role in _PEOPLE:
            run = None
            content = _content(shown.get("content"))
            out.append(ItemMessage(role=str(role), content=content, _items=[item]))
        elif kind in RESULT_TYPES:
            run = None
            out.append(_result(item, shown, names))
        elif isinstance(kind, str) and kind.endswith("_output") and out:
            _attach(out[-1], item, shown)
        else:
            if run is None:
                run = ItemMessage(role="assistant", content=[], _items=[])
                out.append(run)
            _add_to_run(run, item, shown, names)
    return cast(list[ChatMessage], out)


def references(items: object) -> list[str]:
    """The ids the ``item_reference`` items of ``items`` (a request's input) name."""
    if not isinstance(items, list):
        return []
    return [
        item["id"]
        for item in items
        if item.get("type") == "item_reference" and isinstance(item.get("id"), str)
    ]


def check_count(count: int, max_items: int, expanded: bool = False) -> None:
    """The client's 400 when ``input`` holds more than ``max_items`` items (``expanded``:
    once its ``compaction`` items are read as the items they carry)."""
    if count > max_items:
        once = " once its compaction items are expanded" if expanded else ""
        raise InvalidRequest(
            f"'input' has {count} items{once}; this proxy accepts at most {max_items}.",
            param="input",
        )


def _shown(item: Item, found: Mapping[str, Item] | None) -> Item:
    """What ``item`` says: itself, or for a reference the item it names, if found."""
    if item.get("type") != "item_reference" or not found:
        return item
    return found.get(str(item.get("id")), item)


def to_items(messages: Sequence[ChatMessage]) -> list[Item]:
    """The input items for rebuilt ``messages``: each client item verbatim (an elided
    result with its placeholder as ``output``), each message the proxy wrote as an
    input message of its role."""
    out: list[Item] = []
    for message in messages:
        items = cast(ItemMessage, message).get("_items")
        if items is None:  # the handoff, its acknowledgement, a trim marker
            out.append(
                {"type": "message", "role": message["role"], "content": message.get("content")}
            )
            continue
        content = message.get("content")
        for item in items:
            placeholder = (
                message["role"] == "tool"
                and item.get("type") in RESULT_TYPES
                and isinstance(content, str)
                and content != item.get("output")
            )
            out.append({**item, "output": content} if placeholder else item)
    return out


def _result(item: Item, shown: Item, names: dict[str, str]) -> ItemMessage:
    call_id = str(shown.get("call_id", ""))
    message = ItemMessage(
        role="tool", tool_call_id=call_id, content=_content(shown.get("output")), _items=[item]
    )
    if call_id in names:  # the elision placeholder names the tool
        message["name"] = names[call_id]
    return message


def _add_to_run(run: ItemMessage, item: Item, shown: Item, names: dict[str, str]) -> None:
    run["_items"].append(item)
    parts = cast(list[dict[str, Any]], run["content"])
    kind = shown.get("type", "message")
    if kind == "message":
        content = _content(shown.get("content"))
        parts.extend([{"type": "text", "text": content}] if isinstance(content, str) else content)
    elif kind in _CALL_TYPES:
        name, call_id = str(shown.get("name", "")), str(shown.get("call_id", ""))
        arguments = shown.get("arguments" if kind == "function_call" else "input", "")
        names[call_id] = name
        call = ToolCall(
            id=call_id, type="function", function={"name": name, "arguments": str(arguments)}
        )
        run.setdefault("tool_calls", []).append(call)
    elif kind == "item_reference":  # not found: priced conservatively, named as unseen
        parts.append({"type": UNSEEN_ITEM, "id": str(shown.get("id", ""))})
    else:  # reasoning, hosted tool calls, anything newer
        parts.append(_opaque(shown))


def _attach(message: ItemMessage, item: Item, shown: Item) -> None:
    """An output that belongs to whatever came before it (a computer or shell call)."""
    message["_items"].append(item)
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    message["content"] = [*(content or []), _opaque(shown)]


def _content(content: object) -> str | list[dict[str, Any]]:
    """Message or output content as chat content: text parts as text, images as images,
    everything else counted as its JSON."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return [] if content is None else [_opaque(content)]
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "refusal", "refusal": part["refusal"]})
        elif kind == "input_image":
            image = {"detail": part.get("detail", "auto")}
            source = {k: part.get(k) for k in ("image_url", "file_id")}  # told apart by digests
            parts.append({"type": "image_url", "image_url": image, "source": source})
        else:
            parts.append(_opaque(part))
    return parts


def _opaque(value: object) -> dict[str, Any]:
    # A content part of a type no counter knows is counted as its JSON, and neither the
    # transcript nor the identifier check reads it.
    return {"type": "item", "item": value}
