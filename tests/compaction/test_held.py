"""compaction/held.py: the view served last is held over a newer snapshot while the
upstream caches the session's prompts, its cache is warm and it fits under the trigger."""

from __future__ import annotations

from time import perf_counter

import pytest
from prometheus_client import CollectorRegistry

from proxy.compaction import held as held_module
from proxy.compaction.held import HeldCuts, cache_warm, upstream_caches
from proxy.core.budget import Budget
from proxy.core.digest import digests_and_sizes, prefix_hash
from proxy.core.history import History, result_flags
from proxy.core.ledger import Entry
from proxy.core.session import session_from_header
from proxy.core.snapshot import Loaded, Snapshot
from proxy.observe.ledger import Ledger, Totals
from proxy.observe.record import Record, recording
from tests.support.conversations import convo

KEY = session_from_header("tenant", "held")
# 100 tokens a message; the summary 50.
BUDGET = Budget(window=2000, reserve=0, fixed=0, trigger=1600, target=1000, summary_allowance=200)


def history(turns: int) -> History:
    messages = convo("s " + "u a " * turns + "u")
    digests, _ = digests_and_sizes(messages)
    counts = [100] * len(messages)
    return History(messages, digests, counts, 1, 0, result_flags(messages))


def snapshot(h: History, covered: int, version: int) -> Snapshot:
    return Snapshot(
        version, f"summary {version}", 1, covered, covered, prefix_hash(h.digests, covered),
        50, 0, 0, 0.0, 0.0,
    )  # fmt: skip


@pytest.fixture
def caching(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the upstream caches, as the ledger would say: set by each test."""
    said = [True]
    monkeypatch.setattr(held_module, "upstream_caches", lambda: said[0])
    return said


@pytest.fixture
def warm(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the session's last prompt is cached still, as the ledger would say."""
    said = [True]
    monkeypatch.setattr(held_module, "cache_warm", lambda: said[0])
    return said


def test_a_newer_snapshot_waits_while_the_view_served_last_fits(caching: list[bool]) -> None:
    cuts = HeldCuts()
    h = history(6)  # 14 messages
    old = snapshot(h, 3, version=1)
    assert cuts.choose(KEY, h, Loaded(old, old), BUDGET).valid is old  # served: remembered
    grown = history(7)  # 16 messages: 100 + 50 + 13 * 100 = 1450 under v1, under 1600
    new = snapshot(grown, 11, version=2)
    chosen = cuts.choose(KEY, grown, Loaded(new, new), BUDGET)
    assert chosen == Loaded(old, old)
    caching[0] = False  # an upstream that reports no cached tokens: nothing to hold for
    assert cuts.choose(KEY, grown, Loaded(new, new), BUDGET).valid is new


def test_a_newer_snapshot_is_applied_once_the_sessions_cache_expired(
    caching: list[bool], warm: list[bool]
) -> None:
    """Idle past the TTL, the held view's prefix is paid in full anyway: the newer
    snapshot is served on that turn, held from then on, and the record says why."""
    cuts = HeldCuts()
    h = history(6)
    old = snapshot(h, 3, version=1)
    rec = Record("r", 0.0)
    with recording(rec):
        cuts.choose(KEY, h, Loaded(old, old), BUDGET)
        assert rec.cache_plan is None  # nothing newer than what was served
        grown = history(7)  # 1450 under v1: under the trigger
        new = snapshot(grown, 11, version=2)
        assert cuts.choose(KEY, grown, Loaded(new, new), BUDGET).valid is old
        assert rec.cache_plan == "held"
        warm[0] = False
        assert cuts.choose(KEY, grown, Loaded(new, new), BUDGET).valid is new
        assert rec.cache_plan == "expired"
        warm[0] = True
        newer = snapshot(history(8), 13, version=3)
        assert cuts.choose(KEY, history(8), Loaded(newer, newer), BUDGET).valid is new
        assert rec.cache_plan == "held"
        cuts.choose(KEY, history(8), Loaded(newer, newer), BUDGET, asked=True)
        assert rec.cache_plan is None  # asked for: no plan of the cache's


def test_past_the_trigger_the_newer_snapshot_is_served_and_then_held(
    caching: list[bool],
) -> None:
    cuts = HeldCuts()
    h = history(6)
    old = snapshot(h, 3, version=1)
    cuts.choose(KEY, h, Loaded(old, old), BUDGET)
    grown = history(9)  # 20 messages: 100 + 50 + 17 * 100 = 1850 under v1, past 1600
    new = snapshot(grown, 13, version=2)
    assert cuts.choose(KEY, grown, Loaded(new, new), BUDGET).valid is new
    newer = snapshot(grown, 15, version=3)
    assert cuts.choose(KEY, history(10), Loaded(newer, newer), BUDGET).valid is new


def test_the_history_as_sent_is_held_too(caching: list[bool]) -> None:
    cuts = HeldCuts()
    h = history(5)  # 12 messages, 1200 tokens: sent whole, no snapshot yet
    cuts.choose(KEY, h, Loaded(None, None), BUDGET)
    grown = history(6)  # 1400: still under the trigger
    first = snapshot(grown, 9, version=1)
    chosen = cuts.choose(KEY, grown, Loaded(first, first), BUDGET)
    assert chosen == Loaded(None, None)


def test_a_compaction_asked_for_is_not_undone_by_the_next_turn(caching: list[bool]) -> None:
    """A forced (scheduled, recovering) compaction is served; the turn after it must not
    go back to the view served before it (found in review: it did, until the trigger)."""
    cuts = HeldCuts()
    h = history(5)  # 1200 tokens: sent whole
    cuts.choose(KEY, h, Loaded(None, None), BUDGET)
    forced = snapshot(history(6), 9, version=1)
    assert cuts.choose(KEY, history(6), Loaded(forced, forced), BUDGET, asked=True).valid is forced
    grown = history(7)  # an ordinary turn after it, still under the trigger
    assert cuts.choose(KEY, grown, Loaded(forced, forced), BUDGET).valid is forced


def test_a_rewound_history_is_not_held(caching: list[bool]) -> None:
    cuts = HeldCuts()
    h = history(6)
    old = snapshot(h, 3, version=1)
    cuts.choose(KEY, h, Loaded(old, old), BUDGET)
    edited = history(7)
    edited.messages[1] = {"role": "user", "content": "edited"}  # inside what v1 covers
    edited = History(
        edited.messages, digests_and_sizes(edited.messages)[0], edited.counts, 1, 0,
        result_flags(edited.messages),
    )  # fmt: skip
    new = snapshot(edited, 11, version=2)
    assert cuts.choose(KEY, edited, Loaded(new, new), BUDGET).valid is new


def test_the_ledger_says_whether_the_upstream_caches_the_session() -> None:
    ledger = Ledger(CollectorRegistry(), [])
    rec = Record("r", 0.0, tenant="tenant", session_header="held")
    rec.ledger = ledger
    with recording(rec):
        assert upstream_caches() is False  # nothing known of the session
        ledger.sessions[KEY.storage_key] = Totals(Entry(would_send=2000, sent=2000))
        assert upstream_caches() is False  # answers without cached tokens
        ledger.sessions[KEY.storage_key] = Totals(Entry(sent=2000, cached=1024))
        assert upstream_caches() is True


def test_the_ledger_says_whether_the_sessions_cache_is_warm() -> None:
    """By its last prompt's send time and TTL, the rule that judges ``ttl_expiry``."""
    ledger = Ledger(CollectorRegistry(), [])
    rec = Record("r", 0.0, tenant="tenant", session_header="held")
    rec.ledger = ledger
    messages = convo("s u")
    sent = Record("p", 0.0, tenant="tenant", session_header="held", messages=messages)
    sent.digests = digests_and_sizes(messages)[0]
    with recording(rec):
        assert cache_warm() is True  # nothing known: nothing says it expired
        sent.sent_at = perf_counter() - 10
        ledger.cache.observe(sent, KEY.storage_key, (300.0, 3600.0))
        assert cache_warm() is True
        assert ledger.warm(rec, sent.sent_at + 299.5) is True
        assert ledger.warm(rec, sent.sent_at + 300.5) is False
        sent.sent_at = perf_counter() - 301
        ledger.cache.observe(sent, KEY.storage_key, (300.0, 3600.0))
        assert cache_warm() is False
