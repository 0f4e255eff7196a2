"""The archive's write (compaction/archive.py) and recall's read (recall.py), in process:
each compaction archives exactly the span its snapshot newly covers, once; a failing
write never fails the turn; recall finds a session's own originals only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from proxy.core.outcome import Outcome
from proxy.core.passages import Original
from proxy.core.session import SessionKey, session_from_header
from proxy.errors import StoreError
from proxy.pipeline import compacted_view
from proxy.services import Services
from proxy.store import Dropped
from proxy.store.memory import MemoryStore
from proxy.types import ChatMessage
from tests.support.fakes import (
    FILLER,
    TENANT,
    FakeClock,
    FakeUpstream,
    conversation,
    fake_settings,
    make_services,
    metric,
    summary_reply,
    turn_of,
)
from tests.support.faulty_upstream import handoff


class CountingStore(MemoryStore):
    """A memory store that keeps each archive write's positions; ``fail``: writes raise."""

    def __init__(self, clock: FakeClock, fail: bool = False) -> None:
        super().__init__(ttl_s=3600, clock=clock)
        self.writes: list[list[int]] = []
        self.fail = fail

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        if self.fail:
            raise StoreError("archive write refused")
        self.writes.append([o.position for o in originals])
        return await super().archive(key, originals)


def key(session: str = "s1", tenant: str = TENANT) -> SessionKey:
    return session_from_header(tenant, session)


async def view(
    services: Services, messages: list[ChatMessage], session: str = "s1", tenant: str = TENANT
) -> Outcome:
    turn = replace(await turn_of(services, messages, session), tenant=tenant)
    outcome, _ = await compacted_view(services, turn)
    return outcome


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_each_compaction_archives_only_the_span_it_newly_covers(clock: FakeClock) -> None:
    upstream, store = FakeUpstream(), CountingStore(clock)
    upstream.script(summaries=[summary_reply(handoff("first")), summary_reply(handoff("second"))])
    services = make_services(fake_settings(), upstream, clock, store=store)
    history = conversation(14)
    first = await view(services, history)
    assert first.status == "compacted"
    (span,) = store.writes
    assert span[0] == 1  # after the pinned system message
    snapshot = await store.load(key())
    assert snapshot is not None
    assert span == list(range(1, snapshot.covered))
    for _ in range(3):  # turns served from the snapshot write nothing
        assert (await view(services, history)).status == "snapshot"
    assert len(store.writes) == 1
    longer = conversation(14, extra=12)
    assert (await view(services, longer)).status == "compacted"
    second = store.writes[1]
    newer = await store.load(key())
    assert newer is not None
    assert second == list(range(snapshot.covered, newer.covered))  # the new span alone
    archived = await store.load_archive(key())
    assert [o.position for o in archived] == span + second
    assert archived[0].text == history[1]["content"]  # verbatim
    assert metric(services.metrics, "archive_writes", outcome="archived") == 2


async def test_a_failing_archive_write_is_counted_and_the_turn_goes_on(clock: FakeClock) -> None:
    upstream, store = FakeUpstream(), CountingStore(clock, fail=True)
    upstream.script(summaries=[summary_reply(handoff("first"))])
    services = make_services(fake_settings(), upstream, clock, store=store)
    outcome = await view(services, conversation(14))
    assert outcome.status == "compacted"
    assert metric(services.metrics, "archive_writes", outcome="failed") == 1
    assert await store.load(key()) is not None  # the snapshot was saved all the same


async def test_recall_finds_the_sessions_own_originals_and_no_other_tenants(
    clock: FakeClock,
) -> None:
    upstream, store = FakeUpstream(), CountingStore(clock)
    upstream.script(summaries=[summary_reply(handoff("x")), summary_reply(handoff("y"))])
    services = make_services(fake_settings(), upstream, clock, store=store)
    history = conversation(14)
    history[3] = {
        "role": "user",
        "content": f"Turn 1: the vault combination is zircon-5521. {FILLER}",
    }
    await view(services, history)
    asked = [*history[:-1], {"role": "user", "content": "What is the vault combination?"}]
    outcome = await view(services, asked)
    assert outcome.recalled == 1
    newest = str(outcome.messages[-1]["content"])  # the block opens the question's turn
    assert newest.index("zircon-5521") < newest.index("What is the vault combination?")
    # Another tenant, the same session name and question, its own history without it:
    # its own archive, in which nothing holds it.
    theirs = [*conversation(14)[:-1], asked[-1]]
    await view(services, conversation(14), tenant="b")
    outcome = await view(services, theirs, tenant="b")
    assert outcome.status == "snapshot"
    assert not any("zircon" in str(m.get("content")) for m in outcome.messages)
    assert await store.load_archive(key(tenant="b"))
    assert not any("zircon" in o.text for o in await store.load_archive(key(tenant="b")))
