"""The ledger kept: each request's entry (core/ledger.py) summed per session and per
tenant (totals.py), and counted in series of its own (metrics/shadow.py, metrics/regret.py), on
``Metrics.registry``; with each request's prompt-cache outcome (cache_ledger.py) and the
tool calls a compaction made the model repeat (metrics/regret.py).

``Recorder.finish`` hands every finished chat request's record to ``Ledger.finish``; a
summary that ends after its request's line (a background pre-compaction) reaches
``Ledger.late`` through its record. What is shared: the series, summed across workers by
``/metrics`` and across replicas by Prometheus. What is not: the per-session and
per-tenant totals (``GET /sessions/{id}``, ``GET /admin/tenants``) and the calibration
ratios are this process's since it started, bounded (least recently used dropped): one
worker's or replica's view.

Money needs a price: the first ``pricing`` rule matching the model, else the model
registry's list price (``core/registry.py``); totals priced from the registry say so
(``prices``), since list prices are not what every account pays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter

from proxy.core.cache_outcome import CacheOutcome, Cause
from proxy.core.ledger import (
    NOTHING,
    Counted,
    Entry,
    Figures,
    Ledgered,
    figures_for,
    learn_ratio,
    sent_whole,
    summed,
)
from proxy.core.prices import DEFAULT_TTLS, Price, cache_ttls, price_for, sides
from proxy.core.registry import Prices, Registry
from proxy.core.session import session_from_header
from proxy.observe.cache_ledger import CacheLedger
from proxy.observe.metrics.regret import RegretLedger
from proxy.observe.metrics.shadow import ShadowSeries
from proxy.observe.tally import plain_child
from proxy.observe.totals import KINDS, Sides, Totals, totals_of

if TYPE_CHECKING:
    from proxy.core.outcome import Outcome
    from proxy.observe.record import Record

_SESSIONS_LIMIT = 10_000
_TENANTS_LIMIT = 10_000
# A request's money, both sides (None: unpriced), and whether a price in it is the
# model registry's list price.
_Money = tuple[Sides | None, bool]


class Ledger:
    def __init__(
        self, registry: CollectorRegistry, pricing: list[Any], listed: Registry | None = None
    ) -> None:
        self._pricing = pricing
        self._listed = listed  # the model registry: list prices for models pricing lacks
        self._list_prices: dict[str, Price | None] = {}  # by model name, bounded
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
            "Summarizer tokens by direction (input, output; cached_input: of the input, "
            "what the provider's cache served), every call, from its usage",
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
            "USD at the prices in pricing, else the model registry's list prices, by side: "
            "would_have_paid (the history as sent), paid (what was sent, and the summaries); "
            "saved = would_have_paid - paid",
            ["side"],
            registry=registry,
        )
        self.shadow = ShadowSeries(registry)  # what shadow mode would have sent
        self.cache = CacheLedger(registry)  # each request's cache outcome
        self.regret = RegretLedger(registry)  # tool calls a compaction made the model repeat
        self.named = NamedSessions()
        # Each kind's child's value, looked up once and plain (tally.py): ``labels()``
        # costs a lock and checks per call, ``inc`` checks what ``_add`` does (amounts
        # > 0), as recorder.py's.
        self._kinds = tuple(plain_child(self.tokens.labels(kind=kind)) for kind in KINDS)
        self._estimated = plain_child(self.estimated)
        self._would_have_paid = plain_child(self.cost.labels(side="would_have_paid"))
        self._paid = plain_child(self.cost.labels(side="paid"))
        for direction in ("input", "output", "cached_input"):
            self.summarizer.labels(direction=direction)
        for side in ("would_have_paid", "paid"):
            self.cost.labels(side=side)

    def finish(self, rec: Record) -> Ledgered | None:
        """The entry of ``rec`` (a chat request, finished), as its figures, its money
        saved and its cache outcome, counted in the series and its session's and
        tenant's totals; None for other requests."""
        outcome = rec.outcome
        if rec.model is None or (outcome is None and not rec.summarized[0]):
            return None
        if outcome is not None and outcome.shadow is not None:
            self.shadow.observe(outcome.shadow)
        counted = rec.upstream_status == 200 and outcome is not None
        session = self._session_key(rec)
        figures, cache, regret = NOTHING, None, 0
        if counted and outcome is not None:
            if rec.cache_plan is not None:  # a cache-aware turn's (compaction/held.py)
                self.cache.planned(rec.cache_plan)
            if session:
                ttls = cache_ttls(self._pricing, rec.model) if self._pricing else DEFAULT_TTLS
                cache = self.cache.observe(rec, session, ttls)
                regret = self.regret.observe(rec, session, cache[0] != "hit")
            cold = cache is not None and cache[0] in ("cold_start", "ttl_expiry")
            figures = self._figures(rec, outcome, session, cold)
        figures = summed(figures, rec.summarized, rec.summary_cached)
        money, listed = self._money(figures, rec.model, rec.summarizer_model)
        self._add(rec.tenant, session, (figures, money), counted, listed)
        if cache is not None:
            self._add_cache(rec.tenant, session, cache, regret)
        return figures, None if money is None else money[0] - money[1], cache

    def _figures(self, rec: Record, outcome: Outcome, session: str | None, cold: bool) -> Figures:
        """A counted request's entry (summaries apart), and what calibration learns."""
        as_sent, usage, before = outcome.messages is None, rec.usage, rec.tokens_before
        model = (rec.tenant, rec.model or "")
        writes = rec.cache_writes or (0, 0)
        if as_sent and usage is not None:  # most requests: the upstream's count is all
            if before is not None:  # the proxy counted the history too: calibration learns
                ratio = self._ratios.get(model)
                learned = learn_ratio(ratio, before, usage[0])
                if learned is not None and learned != ratio:
                    self._ratios[model] = learned
            return sent_whole(usage, writes)
        totals = self.sessions.get(session) if session else None
        ratio = self._ratios.get(model) or 1.0
        facts = Counted(before, outcome.tokens, as_sent, usage, ratio, writes, cold)
        return figures_for(facts, totals.last_would_send if totals else 0)

    def caches(self, rec: Record) -> bool:
        """Whether the upstream reported cached tokens for ``rec``'s session so far."""
        session = self._session_key(rec)
        totals = self.sessions.get(session) if session else None
        return totals is not None and totals.entry.cached > 0

    def warm(self, rec: Record, now: float) -> bool:
        """Whether the prompt ``rec``'s session sent last is cached still at ``now``
        (cache_ledger.py); True when the ledger has not seen the session."""
        session = self._session_key(rec)
        return not session or self.cache.warm(session, now)

    def late(
        self, rec: Record, model: str, summarized: tuple[int, int, bool], cached: int = 0
    ) -> None:
        """A summary's tokens spent after ``rec``'s line was written (in the background)."""
        figures = summed(NOTHING, summarized, cached)
        money, listed = self._money(figures, rec.model or model, model)
        self._add(rec.tenant, self._session_key(rec), (figures, money), False, listed)

    def _session_key(self, rec: Record) -> str | None:
        """The key a session's totals are filed under: its name's (``GET /sessions/{id}``
        reads it), else the derived session's."""
        if rec.session_header is not None:
            return self.named.of(rec.tenant, rec.session_header)[0]
        return None if rec.session is None else rec.session.storage_key

    def _money(self, figures: Figures, model: str, summarizer: str | None) -> _Money:
        """What the request would have cost and what it cost (None: ``model`` has no
        price), counted, and whether a price in it is the registry's."""
        price, listed = self._price(model)
        if price is None:
            return None, False
        theirs, listed_too = self._price(summarizer) if summarizer else (None, False)
        would, paid = sides(Entry(*figures), price, theirs)
        self._would_have_paid.inc(max(would, 0.0))
        self._paid.inc(max(paid, 0.0))
        return (would, paid), listed or listed_too

    def _price(self, model: str) -> tuple[Price | None, bool]:
        """``model``'s price: its pricing rule's, else the registry's (True)."""
        price = price_for(self._pricing, model) if self._pricing else None
        if price is not None or self._listed is None:
            return price, False
        known = self._list_prices
        if model not in known:
            if len(known) >= _LISTED_LIMIT:  # names are the clients': start again
                known.clear()
            entry = self._listed.lookup(model)
            known[model] = _list_price(entry.prices if entry is not None else None)
        price = known[model]
        return price, price is not None

    def _add_cache(
        self, tenant: str, session: str | None, cache: tuple[CacheOutcome, Cause], regret: int
    ) -> None:
        if session:
            totals_of(self.sessions, session).add_cache(*cache, regret)
        if tenant:
            totals_of(self.tenants, tenant).add_cache(*cache, regret)

    def _add(
        self,
        tenant: str,
        session: str | None,
        priced: tuple[Figures, Sides | None],
        counted: bool,
        listed: bool = False,
    ) -> None:
        figures, money = priced
        for child, amount in zip(self._kinds, figures):  # noqa: B905 (KINDS: Figures' first six)
            if amount > 0:
                child.inc(amount)
        if figures[4]:
            self.summarizer.labels(direction="input").inc(figures[4])
        if figures[5]:
            self.summarizer.labels(direction="output").inc(figures[5])
        if figures[10]:
            self.summarizer.labels(direction="cached_input").inc(figures[10])
        if figures[6]:
            self._estimated.inc(1)
        if session:
            totals_of(self.sessions, session).add(figures, money, counted, listed)
        if tenant:
            totals_of(self.tenants, tenant).add(figures, money, counted, listed)


def _list_price(prices: Prices | None) -> Price | None:
    """A registry listing's prices as the ledger's, when it lists input and output: its
    cache write (where listed) is the 5-minute tier's; the hour's, unlisted, is input's
    multiple (core/prices.py)."""
    if prices is None or prices.input is None or prices.output is None:
        return None
    cached = prices.input if prices.cache_read is None else prices.cache_read
    return Price(prices.input, cached, prices.output, prices.cache_write)


class NamedSessions:
    """A named session's store key and log id, by tenant and name: hashed once for a
    session's requests rather than twice each (its ledger totals, its line), ~2.7 µs. Up
    to ``_NAMES_KEPT`` names (they are the clients'), then anew."""

    def __init__(self) -> None:
        self._named: dict[tuple[str, str], tuple[str, str]] = {}

    def of(self, tenant: str, name: str) -> tuple[str, str]:
        """``session_from_header(tenant, name)``'s ``storage_key`` and ``log_id``."""
        found = self._named.get((tenant, name))
        if found is None:
            key = session_from_header(tenant, name)
            found = (key.storage_key, key.log_id)
            if len(self._named) >= _NAMES_KEPT:
                self._named.clear()
            self._named[tenant, name] = found
        return found


_NAMES_KEPT = 4096
_LISTED_LIMIT = 4096
