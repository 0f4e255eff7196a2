"""A session's slots (issue 24 item 1): several chain-checked snapshots per named or
derived session, the newest one a history starts with, rewind points, misses."""

from __future__ import annotations

from proxy.compaction.snapshots import keep_rewind_point, load_session
from proxy.config import SessionSettings
from proxy.core.session import (
    session_from_header,
    session_from_history,
    session_slots,
    slot_base,
    slot_count,
)
from proxy.store.memory import MemoryStore
from tests.compaction.test_snapshots import history, snapshot_of
from tests.support.conversations import convo

BASE = convo("s u a u a u a u a u")


def test_every_slot_is_the_same_tenant_and_session_and_names_its_base() -> None:
    for key in (session_from_header("t", "name"), session_from_history("t", BASE)):
        slots = session_slots(key, 4)
        assert slots[0] == key
        assert len(set(slots)) == 4
        assert {(k.tenant, k.source) for k in slots} == {("t", key.source)}
        assert all(slot_base(k) == key and session_slots(k, 4) == slots for k in slots)
    other = session_slots(session_from_header("u", "name"), 4)
    assert not set(other) & set(session_slots(session_from_header("t", "name"), 4))


def test_named_and_derived_sessions_take_their_own_slot_counts() -> None:
    settings = SessionSettings(explicit_slots=3, derived_slots=5)
    assert slot_count(session_from_header("t", "name"), settings) == 3
    assert slot_count(session_from_history("t", BASE), settings) == 5
    assert SessionSettings().explicit_slots == 4


async def test_the_newest_snapshot_the_history_starts_with_is_loaded() -> None:
    store, h = MemoryStore(ttl_s=60), history(BASE)
    key = session_from_header("t", "name")
    older, newer, unrelated = session_slots(key, 3)
    assert await store.save(older, snapshot_of(h, covered=3, version=1, updated_at=100.0))
    assert await store.save(newer, snapshot_of(h, covered=7, version=1, updated_at=300.0))
    other = history([*convo("s u a u a u a u a u")[:1], {"role": "user", "content": "x"}])
    assert await store.save(unrelated, snapshot_of(other, covered=2, version=1, updated_at=400.0))
    found, loaded = await load_session(store, key, h, slots=3)
    assert (found, loaded.valid and loaded.valid.covered) == (newer, 7)
    rewound = history(BASE[:6])  # the newer cut is gone, the older one still holds
    found, loaded = await load_session(store, key, rewound, slots=3)
    assert (found, loaded.valid and loaded.valid.covered) == (older, 3)


async def test_a_miss_takes_a_free_slot_then_evicts_and_says_which() -> None:
    store, heard = MemoryStore(ttl_s=60), []
    key = session_from_header("t", "name")
    slots = session_slots(key, 2)
    found, _ = await load_session(store, key, history(BASE), 2, heard.append)
    assert (found, heard) == (slots[0], [])  # nothing stored: no miss
    other = history([*convo("s u a u a u")[:1], {"role": "user", "content": "x"}])
    assert await store.save(slots[0], snapshot_of(other, covered=2, version=1))
    found, _ = await load_session(store, key, history(BASE), 2, heard.append)
    assert (found, heard) == (slots[1], ["free"])
    assert await store.save(slots[1], snapshot_of(other, covered=2, version=1, updated_at=50.0))
    found, loaded = await load_session(store, key, history(BASE), 2, heard.append)
    assert (found, heard, loaded.version) == (slots[1], ["free", "evicted"], 1)


async def test_a_replaced_snapshot_is_kept_in_a_free_slot_only() -> None:
    store, h = MemoryStore(ttl_s=60), history(BASE)
    key = session_from_header("t", "name")
    first, second, third = session_slots(key, 3)
    old = snapshot_of(h, covered=3, version=5, compact_requested_at=9.0)
    await keep_rewind_point(store, first, old, 3)
    kept = await store.load(second)
    assert kept is not None
    assert (kept.version, kept.covered, kept.compact_requested_at) == (1, 3, 0)
    theirs = snapshot_of(h, covered=5, version=1)
    assert await store.save(third, theirs)
    await keep_rewind_point(store, first, snapshot_of(h, covered=4, version=6), 3)
    assert (await store.load(second), await store.load(third)) == (kept, theirs)
