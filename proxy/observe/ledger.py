"""The ledger kept: each request's entry (core/ledger.py) summed per session and per
tenant, and counted in series of its own (metrics.py is full), on ``Metrics.registry``.

``Recorder.finish`` hands every finished chat request's record to ``Ledger.finish``; a
summary that ends after its request's line (a background pre-compaction) reaches
``Ledger.late`` through its record. What is shared: the series, summed across workers by
``/metrics`` and across replicas by Prometheus. What is not: the per-session and
per-tenant totals (``GET /sessions/{id}``, ``GET /admin/tenants``) and the calibration
ratios are this process's since it started, bounded (least recently used dropped): one
worker's or replica's view.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter

from proxy.core.ledger import (
    Counted,
    Entry,
    Price,
    entry_for,
    learn_ratio,
    money_saved,
    price_for,
    with_summaries,
)
from proxy.core.session import session_from_header
from proxy.observe.shadow_series import ShadowSeries
from proxy.observe.tally import plain_child

if TYPE_CHECKING:
    from proxy.observe.record import Record

KINDS = ("would_send", "sent", "cached", "would_cached", "summarizer_input", "summarizer_output")
_SESSIONS_LIMIT = 10_000
_TENANTS_LIMIT = 10_000
# Entry's figures a Totals sums, in Entry's field order (``estimated`` apart).
_SUMMED = ("would_send", "sent", "cached", "would_cached", "summarizer_input", "summarizer_output")


class Totals:
    """A session's or a tenant's sum (``entry``), the money saved (None: unpriced), the
    last would_send (the next request's cache estimate) and how many requests. The sums
    are plain numbers added in place: a new ``Entry`` per request (``Entry.plus``, a
    frozen dataclass of seven fields) cost more than the rest of the ledger's step."""

    __slots__ = ("_estimated", "_sums", "last_would_send", "money", "requests")

    def __init__(
        self, entry: Entry, money: float | None = None, last_would_send: int = 0, requests: int = 0
    ) -> None:
        self._sums = [getattr(entry, name) for name in _SUMMED]
        self._estimated = entry.estimated
        self.money = money
        self.last_would_send = last_would_send
        self.requests = requests

    @property
    def entry(self) -> Entry:
        would_send, sent, cached, would_cached, given, written = self._sums
        return Entry(would_send, sent, cached, would_cached, given, written, self._estimated)

    def add(self, entry: Entry, money: float | None, counted: bool) -> None:
        sums = self._sums  # in _SUMMED's order
        sums[0] += entry.would_send
        sums[1] += entry.sent
        sums[2] += entry.cached
        sums[3] += entry.would_cached
        sums[4] += entry.summarizer_input
        sums[5] += entry.summarizer_output
        self._estimated = self._estimated or entry.estimated
        if money is not None:
            self.money = (self.money or 0.0) + money
        if counted:
            self.requests += 1
            self.last_would_send = entry.would_send

    def as_dict(self) -> dict[str, Any]:
        out = self.entry.as_dict()
        out["requests"] = self.requests
        if self.money is not None:
            out["money_saved_usd"] = round(self.money, 6)
        return out


class Ledger:
    def __init__(self, registry: CollectorRegistry, pricing: list[Any]) -> None:
        self._pricing = pricing
        self.sessions: LRUCache[str, Totals] = LRUCache(_SESSIONS_LIMIT)
        self.tenants: LRUCache[str, Totals] = LRUCache(_TENANTS_LIMIT)
        # Upstream tokens per one of the proxy's, by tenant and model (core/ledger.py).
        self._ratios: LRUCache[tuple[str, str], float] = LRUCache(_TENANTS_LIMIT)
        self.tokens = Counter(
            "compaction_proxy_tokens_saved",
            "The ledger's input tokens, by kind: would_send (the history as the client sent "
            "it, calibrated), sent, cached (of sent), would_cached (of would_send, estimated), "
            "summarizer_input, summarizer_output; net saved = would_send - sent - summarizer_*",
            ["kind"],
            registry=registry,
        )
        self.summarizer = Counter(
            "compaction_proxy_summarizer_tokens",
            "Summarizer tokens by direction (input, output), every call, from its usage",
            ["direction"],
            registry=registry,
        )
        self.estimated = Counter(
            "compaction_proxy_ledger_estimated_requests",
            "Requests whose ledger entry is estimated (the upstream or summarizer gave no usage)",
            registry=registry,
        )
        self.cost = Counter(
            "compaction_proxy_cost_usd",
            "USD at the configured prices (pricing), by side: would_have_paid (the history as "
            "sent), paid (what was sent, and the summaries); saved = would_have_paid - paid",
            ["side"],
            registry=registry,
        )
        self.shadow = ShadowSeries(registry)  # what shadow mode would have sent
        # Each kind's child's value, looked up once and plain (tally.py): ``labels()``
        # costs a lock and checks per call, ``inc`` checks what ``_add`` does (amounts
        # > 0), as recorder.py's.
        self._kinds = tuple((kind, plain_child(self.tokens.labels(kind=kind))) for kind in KINDS)
        for direction in ("input", "output"):
            self.summarizer.labels(direction=direction)
        for side in ("would_have_paid", "paid"):
            self.cost.labels(side=side)

    def finish(self, rec: Record) -> tuple[Entry, float | None] | None:
        """The entry of ``rec`` (a chat request, finished) and its money saved, counted in
        the series and its session's and tenant's totals; None for other requests."""
        if rec.model is None or (rec.outcome is None and not rec.summarized[0]):
            return None
        if rec.outcome is not None and rec.outcome.shadow is not None:
            self.shadow.observe(rec.outcome.shadow)
        counted = rec.upstream_status == 200 and rec.outcome is not None
        session = _session_key(rec)
        totals = self.sessions.get(session) if session else None
        entry = _NOTHING
        if counted and rec.outcome is not None:
            as_sent, model = rec.outcome.messages is None, (rec.tenant, rec.model)
            ratio = self._ratios.get(model)
            facts = Counted(rec.tokens_before, rec.outcome.tokens, as_sent, rec.usage, ratio or 1.0)
            entry = entry_for(facts, totals.last_would_send if totals else 0)
            if as_sent and rec.usage is not None and rec.tokens_before is not None:
                learned = learn_ratio(ratio, rec.tokens_before, rec.usage[0])
                if learned is not None:
                    self._ratios[model] = learned
        entry = with_summaries(entry, rec.summarized)
        money = self._money(entry, rec.model, rec.summarizer_model)
        self._add(rec, session, (entry, money), counted)
        return entry, money

    def caches(self, rec: Record) -> bool:
        """Whether the upstream reported cached tokens for ``rec``'s session so far."""
        session = _session_key(rec)
        totals = self.sessions.get(session) if session else None
        return totals is not None and totals.entry.cached > 0

    def late(self, rec: Record, model: str, summarized: tuple[int, int, bool]) -> None:
        """A summary's tokens spent after ``rec``'s line was written (in the background)."""
        entry = with_summaries(Entry(), summarized)
        money = self._money(entry, rec.model or model, model)
        self._add(rec, _session_key(rec), (entry, money), False)

    def _money(self, entry: Entry, model: str, summarizer: str | None) -> float | None:
        price = price_for(self._pricing, model)
        if price is None:
            return None
        theirs = price_for(self._pricing, summarizer) if summarizer else None
        self._count_cost(entry, price, theirs)
        return money_saved(entry, price, theirs)

    def _count_cost(self, entry: Entry, price: Price, summarizer: Price | None) -> None:
        paid = -money_saved(replace(entry, would_send=0, would_cached=0), price, summarizer)
        would = money_saved(Entry(entry.would_send, would_cached=entry.would_cached), price, None)
        self.cost.labels(side="would_have_paid").inc(max(would, 0.0))
        self.cost.labels(side="paid").inc(max(paid, 0.0))

    def _add(
        self, rec: Record, session: str | None, priced: tuple[Entry, float | None], counted: bool
    ) -> None:
        entry, money = priced
        for kind, child in self._kinds:
            amount = getattr(entry, kind)
            if amount > 0:
                child.inc(amount)
        if entry.summarizer_input:
            self.summarizer.labels(direction="input").inc(entry.summarizer_input)
        if entry.summarizer_output:
            self.summarizer.labels(direction="output").inc(entry.summarizer_output)
        if entry.estimated:
            self.estimated.inc()
        tables = ((self.sessions, session), (self.tenants, rec.tenant))
        for table, key in tables:
            if key:
                totals = table.get(key)
                if totals is None:
                    totals = table[key] = Totals(Entry())
                totals.add(entry, money, counted)


_NOTHING = Entry()  # frozen: one for every request that counted nothing


def _session_key(rec: Record) -> str | None:
    """The key a session's totals are filed under: its name's (``GET /sessions/{id}``
    reads it), else the derived session's."""
    if rec.session_header is not None:
        return session_from_header(rec.tenant, rec.session_header).storage_key
    return None if rec.session is None else rec.session.storage_key
