"""proxy.observe.ledger.Totals: its sums kept in place add up as ``Entry.plus`` would."""

from __future__ import annotations

from functools import reduce

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.ledger import Entry
from proxy.observe.ledger import Totals

_FIGURE = st.integers(min_value=0, max_value=10**9)
_ENTRIES = st.builds(Entry, _FIGURE, _FIGURE, _FIGURE, _FIGURE, _FIGURE, _FIGURE, st.booleans())


@given(st.lists(_ENTRIES, max_size=8), _ENTRIES)
def test_totals_add_up_as_entries_do(entries: list[Entry], first: Entry) -> None:
    totals = Totals(first)
    for entry in entries:
        totals.add(entry, None, counted=True)
    assert totals.entry == reduce(Entry.plus, entries, first)
    assert totals.requests == len(entries)
    assert totals.as_dict() == {**totals.entry.as_dict(), "requests": len(entries)}
