"""A session's or a tenant's ledger totals (observe/ledger.py keeps them): its requests'
entries summed in place, its money on both sides, its cache outcomes and its regret."""

from __future__ import annotations

from typing import Any

from cachetools import LRUCache

from proxy.core.cache_outcome import CACHE_OUTCOMES, CacheOutcome, Cause
from proxy.core.ledger import Entry, Figures

KINDS = ("would_send", "sent", "cached", "would_cached", "summarizer_input", "summarizer_output")
# Entry's figures a Totals sums, in Entry's field order (``estimated`` apart).
_SUMMED = (*KINDS, "written_5m", "written_1h", "would_written", "summarizer_cached")
# A request's money: what it would have cost without the proxy, and what it cost (USD).
Sides = tuple[float, float]
# A Totals' cache counts: each outcome's, then the prefix changes the proxy made.
_CACHE_KEYS = (*CACHE_OUTCOMES, "prefix_change_by_proxy")


class Totals:
    """A session's or a tenant's sum (``entry``), its money (what it would have cost
    without the proxy and what it cost; None: unpriced), its requests' cache outcomes,
    the last would_send (the next request's cache estimate) and how many requests. The sums
    are plain numbers added in place: a new ``Entry`` per request (``Entry.plus``, a
    frozen dataclass of seven fields) cost more than the rest of the ledger's step."""

    __slots__ = (
        "_cache",
        "_estimated",
        "_sums",
        "last_would_send",
        "listed",
        "money",
        "regret",
        "requests",
    )

    def __init__(
        self, entry: Entry, money: Sides | None = None, last_would_send: int = 0, requests: int = 0
    ) -> None:
        self._sums = [getattr(entry, name) for name in _SUMMED]
        self._estimated = entry.estimated
        self._cache = [0] * len(_CACHE_KEYS)
        self.regret = 0  # tool calls repeated after a compaction dropped them (core/regret.py)
        self.money = money
        self.last_would_send = last_would_send
        self.requests = requests
        self.listed = False  # some of ``money`` is at the registry's list prices

    @property
    def entry(self) -> Entry:
        would_send, sent, cached, would_cached, given, written, *rest = self._sums
        return Entry(would_send, sent, cached, would_cached, given, written, self._estimated, *rest)

    def add(
        self, figures: Figures, money: Sides | None, counted: bool, listed: bool = False
    ) -> None:
        """One request's entry (its ``figures``), its money (both sides; ``listed``: at
        the registry's list prices)."""
        sums = self._sums  # in _SUMMED's order: Figures' but ``estimated``
        sums[0] += figures[0]
        sums[1] += figures[1]
        sums[2] += figures[2]
        sums[3] += figures[3]
        sums[4] += figures[4]
        sums[5] += figures[5]
        sums[6] += figures[7]
        sums[7] += figures[8]
        sums[8] += figures[9]
        sums[9] += figures[10]
        self._estimated = self._estimated or figures[6]
        if money is not None:
            would, paid = self.money or (0.0, 0.0)
            self.money = (would + money[0], paid + money[1])
            self.listed = self.listed or listed
        if counted:
            self.requests += 1
            self.last_would_send = figures[0]

    def add_cache(self, outcome: CacheOutcome, cause: Cause, regret: int = 0) -> None:
        """One request's cache outcome (and who made a prefix change), and the tool
        calls it repeated that a compaction had dropped."""
        self._cache[_CACHE_KEYS.index(outcome)] += 1
        if cause == "proxy":
            self._cache[-1] += 1
        self.regret += regret

    def as_dict(self) -> dict[str, Any]:
        out = self.entry.as_dict()
        out["requests"] = self.requests
        out["cache"] = dict(zip(_CACHE_KEYS, self._cache, strict=True))
        out["regret_tool_calls"] = self.regret
        if self.money is not None:
            would, paid = self.money
            out["money_saved_usd"] = round(would - paid, 6)
            out["would_have_paid_usd"] = round(would, 6)
            out["paid_usd"] = round(paid, 6)
            out["prices"] = "registry" if self.listed else "pricing"
        return out


def totals_of(table: LRUCache[str, Totals], key: str) -> Totals:
    totals = table.get(key)
    if totals is None:
        totals = table[key] = Totals(Entry())
    return totals
