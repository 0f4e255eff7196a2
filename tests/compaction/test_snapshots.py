"""The pure steps around a session's snapshot: validation against the history
(invariant 2), the next snapshot, the budget, and asked-for compactions."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from cachetools import LRUCache

from proxy.compaction.job import Job
from proxy.compaction.schedule import Schedule, scheduled
from proxy.compaction.snapshots import load_session, load_snapshot, next_snapshot
from proxy.config import CompactionSettings
from proxy.core.budget import FRAME_TOKENS, Budget, summary_limit
from proxy.core.digest import LEGACY_ANCHOR, digests_and_sizes, legacy_digests, prefix_hash
from proxy.core.history import History, result_flags
from proxy.core.models import ResolvedModel
from proxy.core.outcome import Turn
from proxy.core.plan import Plan
from proxy.core.session import session_from_header, session_from_history, session_slots
from proxy.core.snapshot import Loaded, Snapshot, valid_snapshot, view_of
from proxy.core.trim import trim_outcome
from proxy.core.view import View
from proxy.core.wording import omitted_marker
from proxy.errors import ContextTooLarge
from proxy.store.memory import MemoryStore
from proxy.types import ChatMessage
from tests.support.conversations import convo


def history(messages: list[ChatMessage], pinned: int = 1, count: int = 10) -> History:
    digests, _ = digests_and_sizes(messages)
    return History(messages, digests, [count] * len(messages), pinned, 0, result_flags(messages))


def snapshot_of(h: History, covered: int, version: int = 3, **kw: object) -> Snapshot:
    fields: dict[str, object] = {
        "version": version,
        "summary": "S",
        "pinned": h.pinned,
        "covered": covered,
        "elide_before": covered,
        "anchor_hash": prefix_hash(h.digests, covered),
        "summary_tokens": 50,
        "tokens_before": 900,
        "tokens_after": 400,
        "created_at": 100.0,
        "updated_at": 200.0,
        **kw,
    }
    return Snapshot(**fields)  # type: ignore[arg-type]


BASE = convo("s u a u a u a u")


def test_a_snapshot_stays_valid_while_the_history_only_grows() -> None:
    snap = snapshot_of(history(BASE), covered=5)
    grown = BASE + convo("s u a u a u a u a u")[8:]
    assert valid_snapshot(snap, history(BASE)) is snap
    assert valid_snapshot(snap, history(grown)) is snap


def test_a_format_1_anchor_is_checked_against_blake2b_digests() -> None:
    """What the previous release stored still proves the same prefix, and only it."""
    h = history(BASE)
    old = prefix_hash(legacy_digests(BASE), 5)
    snap = snapshot_of(h, covered=5, anchor_hash=LEGACY_ANCHOR + old)
    assert valid_snapshot(snap, h) is snap
    assert valid_snapshot(snapshot_of(h, covered=5, anchor_hash=old), h) is None
    edited = [*BASE[:3], {**BASE[3], "content": "edited"}, *BASE[4:]]
    assert valid_snapshot(snap, history(edited)) is None


def test_a_format_1_anchor_is_checked_once_per_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn checks its snapshot more than once (under the lock, while it waits on a
    summary); the BLAKE2b pass over the history is paid by the first check only."""
    import proxy.core.digest

    passes: list[int] = []

    def counted(messages: list[ChatMessage]) -> list[bytes]:
        passes.append(len(messages))
        return legacy_digests(messages)

    monkeypatch.setattr(proxy.core.digest, "legacy_digests", counted)
    monkeypatch.setattr(proxy.core.digest, "_legacy_verdicts", LRUCache(16))  # none from before
    messages = convo("s u a u a u a u a u")
    h = history(messages)
    snap = snapshot_of(
        h, covered=5, anchor_hash=LEGACY_ANCHOR + prefix_hash(legacy_digests(messages), 5)
    )
    for _ in range(3):
        assert valid_snapshot(snap, h) is snap
    assert passes == [5]
    edited = [*messages[:3], {**messages[3], "content": "edited"}, *messages[4:]]
    assert valid_snapshot(snap, history(edited)) is None
    assert passes == [5, 5]


def test_no_snapshot_is_no_valid_snapshot() -> None:
    assert valid_snapshot(None, history(BASE)) is None


@pytest.mark.parametrize(
    "change",
    [
        "rewound below the anchor",
        "rewound to the anchor",
        "edited inside the covered span",
        "edited system prompt",
        "pinned differently",
    ],
)
def test_an_edited_or_rewound_history_invalidates_the_snapshot(change: str) -> None:
    snap = snapshot_of(history(BASE), covered=5)
    messages = [dict(m) for m in BASE]
    pinned = 1
    if change == "rewound below the anchor":
        messages = messages[:4]
    elif change == "rewound to the anchor":
        messages = messages[:5]  # the newest message would be covered
    elif change == "edited inside the covered span":
        messages[3]["content"] = "something else"
    elif change == "edited system prompt":
        messages[0]["content"] = "a new system prompt"
    else:
        pinned = 2
    assert valid_snapshot(snap, history(messages, pinned)) is None  # type: ignore[arg-type]


def test_an_edit_after_the_anchor_keeps_the_snapshot() -> None:
    snap = snapshot_of(history(BASE), covered=5)
    messages = [dict(m) for m in BASE]
    messages[6]["content"] = "edited, but verbatim in the tail"
    assert valid_snapshot(snap, history(messages)) is snap  # type: ignore[arg-type]


async def test_an_invalid_snapshot_keeps_its_version_for_the_compare_and_swap() -> None:
    store = MemoryStore(ttl_s=60)
    key = session_from_header("t", "s1")
    stored = snapshot_of(history(BASE), covered=5, version=7)
    assert await store.save(key, replace(stored, version=1))
    for v in range(2, 8):
        assert await store.save(key, replace(stored, version=v))
    loaded = await load_snapshot(store, key, history(BASE[:4]))
    assert loaded.valid is None
    assert loaded.version == 7
    assert loaded.summary == ""
    assert loaded.view(1) == View(1, 0, 1)
    fresh = await load_snapshot(store, key, history(BASE))
    assert fresh.valid == fresh.stored
    assert fresh.summary == "S"
    assert fresh.view(1) == View(5, 50, 5)


def test_view_of_no_snapshot_leaves_the_history_untouched() -> None:
    assert view_of(None, 2) == View(covered=2, summary_tokens=0, elide_before=2)


def test_next_snapshot_replaces_the_stored_one_and_matches_the_history() -> None:
    h = history(BASE)
    stored = snapshot_of(h, covered=3, version=4, compact_requested_at=time.time())
    plan = Plan("compact", View(5, 70, 6), (3, 5), 321, True)
    budget = Budget(
        window=1000, reserve=100, fixed=20, trigger=800, target=500, summary_allowance=0
    )
    before = time.time()
    new = next_snapshot(Loaded(stored, None), "new summary", plan, job_for(h, budget, "gpt-x"))
    assert new.version == 5  # over the stored version, valid for this history or not
    assert (new.summary, new.pinned, new.covered, new.elide_before) == ("new summary", 1, 5, 6)
    assert new.anchor_hash == prefix_hash(h.digests, 6)
    assert (new.summary_tokens, new.tokens_before, new.tokens_after) == (70, 80 + 120, 321)
    assert new.created_at == 100.0  # the session's, kept
    assert new.updated_at >= before
    assert new.model == "gpt-x"
    assert new.compact_requested_at == 0.0  # the scheduled compaction is this one
    assert valid_snapshot(new, h) is new
    assert valid_snapshot(new, history(BASE[:6])) is None  # anchor 6: newest covered


def test_the_first_snapshot_starts_at_version_one() -> None:
    h = history(BASE)
    plan = Plan("compact", View(1, 0, 5), (1, 1), 300, True)
    budget = Budget(window=1000, reserve=0, fixed=0, trigger=800, target=500, summary_allowance=0)
    new = next_snapshot(Loaded(None, None), "", plan, job_for(h, budget, "m"))
    assert new.version == 1
    assert new.created_at == new.updated_at


def job_for(h: History, budget: Budget, model_name: str) -> Job:
    """A compaction job for ``h`` under ``budget``, to ``model_name``."""
    turn = Turn({"model": model_name, "messages": []}, b"", model(1000, model_name), "t", None, [])
    return Job(turn, session_from_header("t", "s"), h, budget, "threshold")


def model(window: int, name: str = "m") -> ResolvedModel:
    return ResolvedModel(name, window, 4096, "o200k_base", "default")


def test_budget_for_a_model_follows_the_ratios_and_summary_size() -> None:
    c = CompactionSettings(
        trigger_ratio=0.8, target_ratio=0.5, summary_max_tokens=2000, recall_budget_ratio=0.05
    )
    budget = Budget.for_model(model(100_000), c, reserve=4096, fixed=300)
    assert budget == Budget(
        window=100_000,
        reserve=4096,
        fixed=300,
        trigger=80_000,
        target=50_000,
        summary_allowance=2000 + FRAME_TOKENS,
        min_tail_messages=c.min_tail_messages,
        elide_min_tokens=c.elide_min_tokens,
        recall=5_000,
    )


@pytest.mark.parametrize(
    ("window", "max_tokens", "expected"),
    [
        (100_000, 2000, 2000),  # the configured maximum
        (4096, 2000, 614),  # 15% of a small window
        (500, 2000, 128),  # never below the floor
        (100_000, 100, 128),
    ],
)
def test_summary_limit(window: int, max_tokens: int, expected: int) -> None:
    c = CompactionSettings(summary_max_tokens=max_tokens)
    assert summary_limit(model(window), c) == expected
    assert Budget.for_model(model(window), c, 0, 0).summary_allowance == expected + FRAME_TOKENS


def test_a_schedule_is_recent_for_an_hour() -> None:
    snap = snapshot_of(history(BASE), covered=5)
    assert not scheduled(None)
    assert not scheduled(snap)
    assert scheduled(replace(snap, compact_requested_at=time.time() - 60))
    assert not scheduled(replace(snap, compact_requested_at=time.time() - 7200))


def test_force_is_rate_limited_per_session() -> None:
    schedule = Schedule(force_interval_s=30)
    a, b = session_from_header("t", "a"), session_from_header("t", "b")
    assert schedule.may_force(a)
    assert not schedule.may_force(a)
    assert schedule.may_force(b)
    assert Schedule(force_interval_s=0).may_force(a)


async def test_a_scheduled_compaction_is_written_and_hinted_once() -> None:
    store = MemoryStore(ttl_s=60)
    schedule = Schedule(force_interval_s=30)
    key = session_from_header("t", "s")
    assert not await schedule.request(store, key)  # no such session
    await store.save(key, snapshot_of(history(BASE), covered=5, version=1))
    assert await schedule.request(store, key)
    stored = await store.load(key)
    assert stored is not None
    assert (stored.version, scheduled(stored)) == (2, True)
    assert schedule.take_hint("t", "s")
    assert not schedule.take_hint("t", "s")


def test_trimming_drops_the_oldest_groups_and_marks_them() -> None:
    messages = convo("s u a u a u a u a u")
    h = history(messages, count=100)
    budget = Budget(window=700, reserve=0, fixed=0, trigger=600, target=500, summary_allowance=0)
    outcome = trim_outcome(h, Loaded(None, None), budget, "user")
    assert outcome.status == "trimmed"
    assert outcome.messages is not None
    assert outcome.messages[0] is messages[0]
    assert outcome.messages[-1] is messages[-1]
    assert omitted_marker(6) in str(outcome.messages[1]["content"])
    assert outcome.tokens <= budget.target


def test_trimming_leaves_a_history_that_fits_alone() -> None:
    h = history(BASE, count=10)
    budget = Budget(window=700, reserve=0, fixed=0, trigger=60, target=50, summary_allowance=0)
    outcome = trim_outcome(h, Loaded(None, None), budget, "user")
    assert (outcome.status, outcome.messages, outcome.tokens) == ("passthrough", None, 80)


def test_a_newest_message_too_large_for_the_window_is_refused() -> None:
    messages = convo("s u a u")
    digests, _ = digests_and_sizes(messages)
    h = History(messages, digests, [10, 10, 10, 2000], 1, 0, result_flags(messages))
    budget = Budget(window=1000, reserve=0, fixed=0, trigger=800, target=500, summary_allowance=0)
    with pytest.raises(ContextTooLarge):
        trim_outcome(h, Loaded(None, None), budget, "user")


async def test_conversations_that_open_alike_each_find_their_own_snapshot() -> None:
    store = MemoryStore(ttl_s=60)
    first, second = convo("s u a u a u a u"), convo("s u a u a u a u")
    second[3] = {"role": "user", "content": "the second run parts here"}
    key = session_from_history("t", first)
    assert key == session_from_history("t", second)

    slot_a, loaded = await load_session(store, key, history(first), slots=3)
    assert (slot_a, loaded.stored) == (key, None)  # the first slot is the derived key itself
    assert await store.save(slot_a, snapshot_of(history(first), covered=5, version=1))
    slot_b, loaded = await load_session(store, key, history(second), slots=3)
    assert slot_b != slot_a
    assert loaded.stored is None  # a free slot, not the first run's snapshot to replace
    assert await store.save(slot_b, snapshot_of(history(second), covered=5, version=1))

    for messages, slot in ((first, slot_a), (second, slot_b)):
        found, loaded = await load_session(store, key, history(messages), slots=3)
        assert found == slot
        assert loaded.valid is not None


async def test_with_every_slot_taken_the_least_recently_updated_is_replaced() -> None:
    store = MemoryStore(ttl_s=60)
    h = history(BASE)
    key = session_from_history("t", BASE)
    slots = session_slots(key, 3)
    other = history(convo("d u a u a u a u"))  # another conversation's snapshots
    for age, slot in zip((300.0, 100.0, 200.0), slots, strict=True):
        assert await store.save(slot, snapshot_of(other, covered=2, version=1, updated_at=age))
    found, loaded = await load_session(store, key, h, slots=3)
    assert found == slots[1]
    assert loaded.valid is None
    assert loaded.version == 1  # what the compare-and-swap replaces


async def test_a_named_session_with_one_slot_has_exactly_one_place() -> None:
    key = session_from_header("t", "named")
    assert session_slots(key, 1) == [key]
    found, loaded = await load_session(MemoryStore(ttl_s=60), key, history(BASE), slots=1)
    assert (found, loaded.stored) == (key, None)
