"""warm.py: after a background compaction on one slot, the next turn's view is sent for a
single token, giving way to any turn on the model without cancelling the run around it."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.compaction.busy import BusyModels
from proxy.compaction.warm import PURPOSE, warmed
from proxy.core.outcome import Outcome, Turn
from proxy.types import ChatMessage
from tests.support.fakes import MODEL, TENANT, until

VIEW: list[ChatMessage] = [
    ChatMessage(role="system", content="s"),
    ChatMessage(role="user", content="summary of earlier turns"),
    ChatMessage(role="user", content="the newest question"),
]


class ChatWire:
    name = "chat"

    def summary_body(
        self, data: dict[str, Any], messages: list[ChatMessage], max_tokens: int
    ) -> tuple[bytes, int]:
        return orjson.dumps({**data, "messages": messages, "max_tokens": max_tokens}), max_tokens


class Answer:
    status_code = 200

    async def aread_at_most(self, limit: int) -> bytes:
        return b"{}"

    async def aclose(self) -> None:
        return None


class Slot:
    """An upstream whose one slot answers after ``release`` is set; what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[tuple[bytes, bytes]], dict[str, Any]]] = []
        self.release = asyncio.Event()

    async def send(self, method: str, url: Any, headers: Any, content: Any) -> Answer:
        self.sent.append((headers, orjson.loads(content)))
        await self.release.wait()
        return Answer()


def turn(api: ChatWire | None = None) -> Turn:
    chat: Any = {"model": MODEL, "messages": VIEW[:1], "stream": True, "tools": []}
    model: Any = None
    return Turn(chat, orjson.dumps(chat), model, TENANT, "s1", [], api=api, data=dict(chat))


def outcome() -> Outcome:
    return Outcome("compacted", VIEW, 2, 100, 4096)


async def test_the_view_goes_for_one_token_as_the_turns_own_request() -> None:
    slot, busy = Slot(), BusyModels()
    slot.release.set()
    said = await warmed(slot, "http://up/v1", turn(ChatWire()), outcome(), busy)  # type: ignore[arg-type]
    assert said == "warmed"
    headers, body = slot.sent[0]
    assert PURPOSE in headers
    assert body["messages"] == VIEW
    assert body["max_tokens"] == 1
    assert body["tools"] == []  # the turn's own request: what the next turn's prefix holds
    assert not busy.busy(MODEL)


async def test_a_turn_on_the_model_makes_it_give_way_not_the_run() -> None:
    slot, busy = Slot(), BusyModels()
    run = asyncio.create_task(warmed(slot, "http://up/v1", turn(ChatWire()), outcome(), busy))  # type: ignore[arg-type]
    await until(lambda: bool(slot.sent))
    assert busy.busy(MODEL)
    assert not busy.give_way(MODEL)  # a turn arrives: nothing that keeps the slot is left
    assert await run == "gave_way"  # the run around it carries on, uncancelled
    assert not busy.busy(MODEL)
    assert busy.gave_way == set()


async def test_an_api_without_the_turns_request_is_not_warmed() -> None:
    slot, busy = Slot(), BusyModels()
    said = await warmed(slot, "http://up/v1", turn(None), outcome(), busy)  # type: ignore[arg-type]
    assert said == "unsupported"
    assert slot.sent == []
