"""A request's prompt-cache outcome as the ledger judges it (core/cache_outcome.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.cache_outcome import Sent, classify, prefix_of


@dataclass
class Known:
    full: Sequence[bytes] | None
    digests: Sequence[bytes]

    @property
    def count(self) -> int:
        return len(self.digests)

    def at(self, index: int) -> bytes:
        return self.digests[index]


def _all(*names: str) -> Known:
    digests = [n.encode() for n in names]
    return Known(digests, digests)


def _anchors(*names: str) -> Known:
    """Digests read one at a time (a history sent uncounted)."""
    return Known(None, [n.encode() for n in names])


def _sent(view: Known, history: Known, at: float = 0.0, ttl: float = 300.0) -> Sent:
    return Sent(prefix_of(view), prefix_of(history), at, ttl)


def test_outcomes_by_time_and_prefix() -> None:
    history = _all("s", "u1", "a1")
    before = _sent(history, history, at=100.0)
    grown = _all("s", "u1", "a1", "u2")
    assert classify(None, grown, grown, 100.0) == ("cold_start", "none")
    assert classify(before, grown, grown, 399.0) == ("hit", "none")
    assert classify(before, grown, grown, 401.0) == ("ttl_expiry", "none")
    view = _all("s", "summary", "a1", "u2")  # the proxy's new view of a history that grew
    assert classify(before, view, grown, 200.0) == ("prefix_change", "proxy")
    edited = _all("s", "u1*", "a1", "u2")  # the client's own edit
    assert classify(before, edited, edited, 200.0) == ("prefix_change", "client")
    rewound = _all("s", "u1")
    assert classify(before, rewound, rewound, 200.0) == ("prefix_change", "client")


def test_a_history_digested_in_part_is_judged_by_its_first_and_last_message() -> None:
    before = _sent(_anchors("s", "u1", "a1"), _anchors("s", "u1", "a1"))
    grown = _anchors("s", "u1", "a1", "u2")
    assert classify(before, grown, grown, 1.0) == ("hit", "none")
    other = _anchors("s", "u1", "b1", "u2")
    assert classify(before, other, other, 1.0) == ("prefix_change", "client")
    # A full history after an uncounted one: the anchors decide, as both sides have them.
    assert classify(before, _all("s", "u1", "a1", "u2"), grown, 1.0) == ("hit", "none")
