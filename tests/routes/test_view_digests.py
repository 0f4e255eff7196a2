"""One turn digests the same in every API's chat view (digest.py's ``neutral``), so a
snapshot made on one API applies on another; turns that differ still digest apart."""

from __future__ import annotations

from typing import Any

from proxy.core.digest import message_digests
from proxy.routes.items import to_messages
from proxy.routes.messages_view import to_chat

SYSTEM = "You are a careful assistant."
TURNS = [("user", "Turn 0: FACT k0=v0"), ("assistant", "ok: noted"), ("user", "Turn 1")]
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def chat() -> list[Any]:
    return [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": t} for r, t in TURNS]


def messages(**first: Any) -> list[Any]:
    """The Messages view: user text as a string, assistant text as the SDK's blocks, a
    breakpoint on the newest message as Claude Code sets it."""
    out: list[dict[str, Any]] = [
        {"role": r, "content": t if r == "user" else [{"type": "text", "text": t}]}
        for r, t in TURNS
    ]
    out[-1] = {
        "role": "user",
        "content": [{"type": "text", "text": TURNS[-1][1], "cache_control": {"type": "ephemeral"}}],
    }
    out[0] = {**out[0], **first}
    return list(to_chat(SYSTEM, out))


def responses() -> list[Any]:
    items = [
        {"role": "user", "content": t}
        if r == "user"
        else {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []}],
        }
        for r, t in TURNS
    ]
    return list(to_messages(SYSTEM, items))


def test_plain_turns_digest_alike_on_chat_messages_and_responses() -> None:
    seed = 7
    ours = message_digests(chat(), seed)
    assert message_digests(messages(), seed) == ours
    assert message_digests(responses(), seed) == ours


def test_turns_that_differ_still_digest_apart() -> None:
    base = message_digests(messages(), 7)
    edited = message_digests(messages(content="Turn 0: FACT k0=v1"), 7)
    assert edited[1] != base[1]
    pictures = [
        message_digests(messages(content=[{"type": "image", "source": {**PNG, "data": d}}]), 7)[1]
        for d in ("iVBORw0KGgo=", "R0lGODlh")
    ]
    assert pictures[0] != pictures[1]  # two images are two turns
    thinking = {"type": "thinking", "thinking": "hm", "signature": "s"}
    text = {"type": "text", "text": TURNS[1][1]}
    turns = [{"role": "user", "content": TURNS[0][1]}, {"role": "assistant", "content": [text]}]
    plain = message_digests(to_chat(SYSTEM, turns), 7)
    turns[1] = {"role": "assistant", "content": [thinking, text]}
    assert plain[2] == base[2]
    assert message_digests(to_chat(SYSTEM, turns), 7)[2] != base[2]
    images = [
        to_messages(None, [{"role": "user", "content": [{"type": "input_image", "file_id": f}]}])
        for f in ("file-a", "file-b")
    ]
    assert message_digests(images[0]) != message_digests(images[1])
