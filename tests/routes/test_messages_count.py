"""messages_count.py: the view a ``count_tokens`` answer sizes, worked out read-only:
never a summary call, never a store write, and a failure costs the headers only.

End to end with the ``anthropic`` SDK: tests/e2e/test_messages_count_e2e.py."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from starlette.requests import Request

from proxy import pipeline
from proxy.core.outcome import Turn
from proxy.core.session import SessionKey, tenant_from_headers
from proxy.core.snapshot import Snapshot
from proxy.routes.messages import MESSAGES
from proxy.routes.messages_count import view_headers
from proxy.services import Services
from proxy.store.memory import MemoryStore
from tests.support.fakes import (
    MODEL,
    FakeClock,
    FakeUpstream,
    conversation,
    fake_settings,
    make_services,
)

KEY = b"Bearer sk-test"


class CountingStore(MemoryStore):
    """A ``MemoryStore`` that counts its writes (and can fail its reads)."""

    saves = 0
    failing = False

    async def save(self, key: SessionKey, snapshot: Snapshot) -> None:
        self.saves += 1
        await super().save(key, snapshot)

    async def load(self, key: SessionKey) -> Snapshot | None:
        if self.failing:
            raise ConnectionError("store down")
        return await super().load(key)


def messages_body(turns: int, *more: str) -> bytes:
    """A Messages request of ``conversation(turns)`` (its system prompt as ``system``),
    then the turns ``more``, assistant's and user's in turn."""
    chat: list[Any] = conversation(turns)
    roles = ("assistant", "user")
    later = [{"role": roles[i % 2], "content": text} for i, text in enumerate(more)]
    body = {"model": MODEL, "system": chat[0]["content"], "messages": chat[1:] + later}
    return orjson.dumps(body)


def request_for(session: str = "s1") -> Request:
    headers = [(b"authorization", KEY), (b"x-session-id", session.encode())]
    return Request({"type": "http", "method": "POST", "headers": headers})


def services_with(store: CountingStore) -> tuple[Services, FakeUpstream]:
    upstream, clock = FakeUpstream(), FakeClock()
    return make_services(fake_settings(), upstream, clock, store=store), upstream


async def turn_for(services: Services, body: bytes) -> Turn:
    _, chat = MESSAGES.parse(body, 10_000, 1024)
    tenant = tenant_from_headers(request_for().headers)
    model = await services.effective_model(MODEL, tenant)
    return Turn(chat, body, model, tenant, "s1", [(b"authorization", KEY)])


def as_dict(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in headers}


async def test_a_due_compaction_is_said_not_run() -> None:
    store = CountingStore(ttl_s=3600, clock=FakeClock())
    services, upstream = services_with(store)
    got = as_dict(await view_headers(MESSAGES, request_for(), services, messages_body(16)))
    assert got["x-compaction-view-status"] == "due"
    assert got["x-compaction-view-version"] == "0"
    assert int(got["x-compaction-view-tokens"]) > 3000  # the history as sent, counted
    assert upstream.calls == []  # no summary asked for
    assert store.saves == 0


async def test_the_view_counted_is_the_next_requests() -> None:
    store = CountingStore(ttl_s=3600, clock=FakeClock())
    services, _ = services_with(store)
    compacted, _ = await pipeline.compacted_view(
        services, await turn_for(services, messages_body(16))
    )
    assert compacted.status == "compacted"
    saves = store.saves
    nxt = messages_body(16, "We covered the notes.", "And then?")  # the conversation went on
    got = as_dict(await view_headers(MESSAGES, request_for(), services, nxt))
    assert store.saves == saves
    outcome, _ = await pipeline.compacted_view(services, await turn_for(services, nxt))
    assert outcome.status == got["x-compaction-view-status"] == "snapshot"
    assert outcome.version == int(got["x-compaction-view-version"]) == compacted.version
    assert outcome.tokens == int(got["x-compaction-view-tokens"])


async def test_a_failure_costs_the_headers_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = CountingStore(ttl_s=3600, clock=FakeClock())
    store.failing = True
    services, _ = services_with(store)
    with caplog.at_level(logging.INFO, logger="proxy.routes"):
        assert await view_headers(MESSAGES, request_for(), services, messages_body(16)) == []
        assert await view_headers(MESSAGES, request_for(), services, b'{"model": "m"}') == []
    lines: list[Any] = [r for r in caplog.records if r.name == "proxy.routes"]
    assert [r.levelname for r in lines] == ["WARNING", "INFO"]
    assert "ConnectionError" in lines[0].getMessage()
