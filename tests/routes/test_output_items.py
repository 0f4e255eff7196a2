"""Responses ``item_reference`` inputs read as the items they name (routes/items.py), and
the output items of a relayed answer read off its bytes (upstream/output_items.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.core.encodings import load_encoders
from proxy.core.tokens import UNSEEN_ITEM_TOKENS, TokenCounter
from proxy.core.transcript import render_transcript
from proxy.routes.items import references, to_items, to_messages
from proxy.store.items import MAX_ITEM_BYTES, MemoryItems
from proxy.upstream.output_items import ItemWrites, OutputItems

ANSWER = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "content": [
        {"type": "output_text", "text": "The capital of Norway is Oslo.", "annotations": []}
    ],
}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"}


def ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


ITEMS = [
    {"role": "user", "content": "Where?"},
    ref("msg_1"),
    {"role": "user", "content": "Look it up."},
    ref("fc_1"),
    {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
    ref("msg_gone"),
]


def test_a_reference_reads_as_the_item_found_and_goes_back_as_itself() -> None:
    messages = to_messages(None, ITEMS, {"msg_1": ANSWER, "fc_1": CALL})
    assert references(ITEMS) == ["msg_1", "fc_1", "msg_gone"]
    assert messages[1]["content"] == [{"type": "text", "text": "The capital of Norway is Oslo."}]
    assert messages[3]["tool_calls"][0]["id"] == "call_1"
    assert to_items(messages) == ITEMS  # the references themselves, verbatim
    entries = render_transcript(messages)
    assert any("Oslo" in e.text for e in entries if e.role == "assistant")
    assert "[an earlier output not seen: msg_gone]" in entries[-1].text


def test_an_unresolved_reference_is_priced_conservatively() -> None:
    counter = TokenCounter(load_encoders(["o200k_base"])["o200k_base"])
    seen = to_messages(None, [ref("msg_1")], {"msg_1": ANSWER})
    unseen = to_messages(None, [ref("msg_1")])
    assert counter.message(unseen[0]) >= UNSEEN_ITEM_TOKENS
    assert counter.message(seen[0]) < 20


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def done(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": 0, "item": item}


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
async def test_a_streams_output_items_are_kept_whatever_its_chunks(size: int) -> None:
    store = MemoryItems(60)
    items = OutputItems(store, "t")
    delta = {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Oslo"}
    big = {**ANSWER, "id": "msg_big", "content": "x" * MAX_ITEM_BYTES}
    body = sse(delta, done(ANSWER), done(big), done(CALL)).replace(b"\n", b"\r\n")
    for i in range(0, len(body), size):
        items.watch(body[i : i + size])
    await items.keep()
    kept = await store.recall_items("t", ["msg_1", "msg_big", "fc_1"])
    assert [orjson.loads(k) if k else None for k in kept] == [ANSWER, None, CALL]


async def test_a_json_answers_output_items_are_kept() -> None:
    store = MemoryItems(60)
    items = OutputItems(store, "t")
    body = orjson.dumps({"id": "resp_1", "object": "response", "output": [ANSWER, CALL]})
    items.watch(body[:10])
    items.watch(body[10:])
    await items.keep()
    assert await store.recall_items("t", ["msg_1", "fc_1"]) == [
        orjson.dumps(ANSWER),
        orjson.dumps(CALL),
    ]
    assert await store.recall_items("other", ["msg_1"]) == [None]


class SlowItems(MemoryItems):
    """A store whose writes take a while (Redis under load): a read started meanwhile
    sees nothing of them unless it waits."""

    async def remember_items(self, tenant: str, items: Any) -> None:
        await asyncio.sleep(0.05)
        await super().remember_items(tenant, items)


@pytest.mark.parametrize("kind", ["stream", "json"])
async def test_items_read_the_moment_an_answer_ends_are_found(kind: str) -> None:
    """A client that names an answer's items as soon as the answer's last bytes reach it,
    before the follow-up that ran after the answer would have kept them (the Vercel AI
    SDK's tool loop, on a busy machine), finds them."""
    store = ItemWrites(SlowItems(60))
    items = OutputItems(store, "t")
    answer = {"id": "resp_1", "object": "response", "output": [ANSWER, CALL]}
    completed = {"type": "response.completed", "response": answer}
    body = sse(done(ANSWER), done(CALL), completed) if kind == "stream" else orjson.dumps(answer)
    items.watch(body)  # the relay's last chunk; keep() has not run
    found = await store.recall_items("t", ["msg_1", "fc_1"])
    assert found == [orjson.dumps(ANSWER), orjson.dumps(CALL)]
    assert await store.recall_items("other", ["msg_1"]) == [None]  # nobody else's wait


async def test_a_json_answer_is_read_early_a_bounded_number_of_times() -> None:
    """An upstream that ends every chunk with a brace does not make the proxy parse the
    growing body at each one: a few early reads, then once the answer is out."""
    store = ItemWrites(MemoryItems(60))
    items = OutputItems(store, "t")
    body = orjson.dumps({"id": "r", "output": [ANSWER]}).replace(b"}", b" }")
    parts = [p + b"}" for p in body.split(b"}") if p]
    for part in parts:
        items.watch(part)
    assert items._tries <= 3
    await items.keep()
    assert await store.recall_items("t", ["msg_1"]) == [orjson.dumps(ANSWER)]
