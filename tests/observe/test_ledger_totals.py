"""proxy.observe.ledger: a session's and a tenant's totals, kept in place, add up as
``Entry.plus`` would, and ``Ledger.finish`` counts each request's entry."""

from __future__ import annotations

from functools import reduce
from time import perf_counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.core.ledger import Counted, Entry, entry_for, learn_ratio, with_summaries
from proxy.core.outcome import Outcome
from proxy.core.session import session_from_header
from proxy.observe import ledger as ledger_module
from proxy.observe.ledger import Ledger, NamedSessions
from proxy.observe.record import Record
from proxy.observe.totals import KINDS, Totals

_FIGURE = st.integers(min_value=0, max_value=10**9)
_ENTRIES = st.builds(Entry, _FIGURE, _FIGURE, _FIGURE, _FIGURE, _FIGURE, _FIGURE, st.booleans())


@given(st.lists(_ENTRIES, max_size=8), _ENTRIES)
def test_totals_add_up_as_entries_do(entries: list[Entry], first: Entry) -> None:
    totals = Totals(first)
    for entry in entries:
        totals.add(entry.figures, None, counted=True)
    assert totals.entry == reduce(Entry.plus, entries, first)
    assert totals.requests == len(entries)
    cache = dict.fromkeys(("hit", "ttl_expiry", "cold_start", "prefix_change"), 0)
    expected = {**totals.entry.as_dict(), "requests": len(entries)}
    cache["prefix_change_by_proxy"] = 0
    assert totals.as_dict() == {**expected, "cache": cache, "regret_tool_calls": 0}


_USAGE = st.none() | st.tuples(_FIGURE, _FIGURE)
_SUMMARIZED = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.booleans())
_REQUESTS = st.tuples(st.none() | st.integers(0, 10**6), st.booleans(), _USAGE, _SUMMARIZED)


@given(st.lists(_REQUESTS, min_size=1, max_size=10))
def test_the_ledger_counts_each_request_as_its_entry(
    requests: list[tuple[int | None, bool, tuple[int, int] | None, tuple[int, int, bool]]],
) -> None:
    """``Ledger.finish`` counts each chat request's entry (core/ledger.py's arithmetic,
    the calibration it learns as it goes) in its series and its session's and tenant's
    totals, and hands it to the line, whatever the request's shape."""
    ledger = Ledger(CollectorRegistry(), [])
    ratio, previous, total, estimated = None, 0, Entry(), 0
    for before, as_sent, usage, summarized in requests:
        outcome = Outcome(
            "passthrough" if as_sent else "snapshot", None if as_sent else [], 0, 700, 10**6
        )
        rec = Record("r", perf_counter(), model="m", tenant="t" * 64, session_header="s")
        rec.upstream_status, rec.outcome, rec.tokens_before = 200, outcome, before
        rec.usage, rec.summarized = usage, summarized
        facts = Counted(before, 700, as_sent, usage, ratio or 1.0)
        expected = with_summaries(entry_for(facts, previous), summarized)
        got = ledger.finish(rec)
        assert got is not None
        assert got[:2] == (expected.figures, None)
        if as_sent and usage is not None and before is not None:
            ratio = learn_ratio(ratio, before, usage[0])
        previous, total = expected.would_send, total.plus(expected)
        estimated += expected.estimated
    session = next(iter(ledger.sessions.values()))
    assert ledger.tenants["t" * 64].entry == session.entry == total
    assert ledger.tenants["t" * 64].requests == session.requests == len(requests)
    for kind in KINDS:
        got = ledger.tokens.labels(kind=kind)._value.get()
        assert got == getattr(total, kind)
    assert ledger.estimated._value.get() == estimated


def test_a_named_session_is_hashed_once_per_tenant_and_name_and_kept_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its ledger totals' key and its line's id are the name's own, whichever tenant
    names it; past the bound, names are hashed anew."""
    monkeypatch.setattr(ledger_module, "_NAMES_KEPT", 2)
    named = NamedSessions()
    for tenant, name in (("t1", "a"), ("t2", "a"), ("t1", "a"), ("t1", "b"), ("t2", "a")):
        key = session_from_header(tenant, name)
        assert named.of(tenant, name) == (key.storage_key, key.log_id)
        assert len(named._named) <= 2
