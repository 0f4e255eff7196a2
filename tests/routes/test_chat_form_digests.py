"""One turn digests the same in every API's chat view (digest.py's ``neutral``), so a
snapshot made on one API applies on another; turns that differ still digest apart."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from xxhash import xxh3_128_digest

from proxy.core.digest import message_digests, neutral, prefix_hash
from proxy.core.history import History
from proxy.core.snapshot import Snapshot, valid_snapshot
from proxy.routes.items import to_messages
from proxy.routes.messages_chat import to_chat

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


def test_a_tool_loop_digests_alike_on_chat_messages_and_responses() -> None:
    """A call (the model's arguments string on chat, an object on Messages) and its
    result, after a turn of text."""
    arguments = '{"step": 1, "path": "a.py"}'  # as a model writes it: spaced, its order
    chat = [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "contents"},
    ]
    use = {"type": "tool_use", "id": "call_1", "name": "read_file"}
    blocks = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{**use, "input": {"path": "a.py", "step": 1}}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "contents"}],
        },
    ]
    items = [
        {"role": "user", "content": "read it"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": arguments,
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "contents"},
    ]
    ours = message_digests(chat, 7)
    assert message_digests(to_chat(None, blocks), 7) == ours
    assert message_digests(to_messages(None, items), 7) == ours
    other = {**use, "input": {"path": "b.py", "step": 1}}
    blocks[1] = {"role": "assistant", "content": [other]}
    assert message_digests(to_chat(None, blocks), 7)[1] != ours[1]


def test_an_anchor_an_earlier_release_made_still_applies() -> None:
    """Before digests read the neutral form, an anchor chained digests of each view as
    sent (the client's message under ``_message`` included): such a snapshot still
    applies to the history it covers, and still not to an edited one."""
    seed = 7
    view = messages()
    as_sent = [xxh3_128_digest(orjson.dumps(m, option=orjson.OPT_SORT_KEYS), seed) for m in view]
    assert message_digests(view, seed) != as_sent  # the neutral form is another encoding
    snap = Snapshot(
        version=3,
        summary="S",
        pinned=1,
        covered=3,
        elide_before=1,
        anchor_hash=prefix_hash(as_sent, 3),
        summary_tokens=10,
        tokens_before=0,
        tokens_after=0,
        created_at=0.0,
        updated_at=0.0,
    )

    def history(view: list[Any]) -> History:
        n = len(view)
        return History(view, message_digests(view, seed), [1] * n, 1, 0, bytes(n), seed)

    for _ in range(2):  # the second from the verdict kept
        assert valid_snapshot(snap, history(view)) is snap
    assert valid_snapshot(snap, history(messages(content="Turn 0: edited"))) is None
    assert valid_snapshot(replace(snap, anchor_hash=prefix_hash(as_sent, 2)), history(view)) is None


def test_the_inline_path_digests_as_the_neutral_form() -> None:
    """Chat messages digested as they are (the common case, told inline) digest as their
    neutral form would: text with calls, an empty text, a named result."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    shapes: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "let me look", "tool_calls": [call]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "name": "f", "content": "out"},
        {"role": "tool", "tool_call_id": "c", "content": "out"},
    ]
    for message in shapes:
        neutral_form = dict(neutral(message))
        assert message_digests([message], 7) == message_digests([neutral_form], 7), message
        assert dict(neutral(neutral_form)) == neutral_form


def test_every_shape_digests_as_the_canonical_bytes_of_its_neutral_form() -> None:
    """The spec of a digest, against the shortcuts that compute it (a role and a text
    content told inline): XXH3 of the neutral form's JSON, keys sorted, under the seed."""
    part = {"type": "text", "text": "hi"}
    shapes: list[Any] = [
        {"role": "user", "content": "hi"},
        {"content": "hi", "role": "assistant"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [part]},
        {"role": "user", "content": [part, part]},
        {"role": "tool", "content": "out"},
        {"role": "user", "_source": "x"},
        {"role": "user", "Content": "hi"},
        {"role": "user", "content": "hi", "_source": "x"},
        {"role": "tool", "tool_call_id": "c", "name": "f", "content": "out"},
    ]
    for seed in (0, 7):
        expected = [
            xxh3_128_digest(orjson.dumps(neutral(m), option=orjson.OPT_SORT_KEYS), seed)
            for m in shapes
        ]
        assert message_digests(shapes, seed) == expected
