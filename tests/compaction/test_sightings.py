"""sightings.py: a named session is noted in the store after its answer, at most once per
``REFRESH_S`` per process, and never on the request's own path.

That the write runs once the answer is out, before a background compaction the same
turn left: tests/test_chat_pipeline.py (the pipeline runs a turn's follow-ups)."""

from __future__ import annotations

from dataclasses import replace

from proxy.compaction.sightings import REFRESH_S, SessionSightings
from proxy.core.outcome import Outcome
from proxy.core.session import session_from_header
from proxy.store import Sighting
from proxy.store.memory import MemoryStore
from tests.support.fakes import (
    MODEL,
    TENANT,
    WINDOW,
    FakeClock,
    FakeUpstream,
    conversation,
    fake_settings,
    make_services,
    turn_of,
)

WALL = 1_700_000_000.0
SEEN = Outcome("passthrough", None, 0, 321, WINDOW, counted=False)


def sightings(clock: FakeClock) -> tuple[SessionSightings, MemoryStore]:
    store = MemoryStore(ttl_s=3600, clock=clock)
    return SessionSightings(store, clock=clock, wall=lambda: WALL + clock.now), store


async def test_a_named_session_is_noted_once_its_answer_is_out() -> None:
    clock = FakeClock()
    noter, store = sightings(clock)
    services = make_services(fake_settings(), FakeUpstream(), clock, store=store)
    turn = await turn_of(services, conversation(2))
    key = session_from_header(TENANT, "s1")
    write = noter.note(turn, SEEN)
    assert await store.load_seen(key) is None  # nothing written while the request runs
    assert write is not None
    await write()
    assert await store.load_seen(key) == Sighting(6, 321, MODEL, WALL + clock.now)


async def test_a_session_is_written_at_most_once_per_refresh_interval() -> None:
    clock = FakeClock()
    noter, store = sightings(clock)
    services = make_services(fake_settings(), FakeUpstream(), clock, store=store)
    first = noter.note(await turn_of(services, conversation(1)), SEEN)
    assert first is not None
    await first()
    clock.advance(REFRESH_S / 2)
    assert noter.note(await turn_of(services, conversation(2)), SEEN) is None
    clock.advance(REFRESH_S / 2)
    later = noter.note(await turn_of(services, conversation(3)), SEEN)
    assert later is not None
    await later()
    seen = await store.load_seen(session_from_header(TENANT, "s1"))
    assert seen is not None
    assert seen.messages == 8


async def test_a_turn_whose_answer_failed_leaves_the_next_one_due() -> None:
    clock = FakeClock()
    noter, store = sightings(clock)
    services = make_services(fake_settings(), FakeUpstream(), clock, store=store)
    turn = await turn_of(services, conversation(1))
    assert noter.note(turn, SEEN) is not None  # its follow-up never runs
    assert noter.note(turn, SEEN) is not None


async def test_a_derived_session_has_no_id_to_ask_by_and_is_not_noted() -> None:
    clock = FakeClock()
    noter, store = sightings(clock)
    services = make_services(fake_settings(), FakeUpstream(), clock, store=store)
    turn = replace(await turn_of(services, conversation(1)), session_header=None)
    assert noter.note(turn, SEEN) is None
