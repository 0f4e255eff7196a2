"""The ledger's money (core/ledger.py's entries, priced): what a request would have cost
and what it cost, at the provider's prices, as the provider bills.

A prompt is billed in parts: its uncached input at ``input``, what the cache read at
``cached_input``, what the cache wrote at the write price of its tier (Anthropic: 1.25
times input for 5 minutes, 2 times for an hour; a provider that reports no writes,
OpenAI, bills none), and the summaries at the summarizer model's prices (what its cache
served of their input at its cached price; what it wrote, at input's).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from proxy.pricing import WRITE_1H, WRITE_5M

if TYPE_CHECKING:
    from proxy.core.ledger import Entry


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens: input, cached input (a cache read), output, and a cache
    write at the 5-minute and the hour's tier (None: the input price's multiples)."""

    input: float
    cached_input: float
    output: float
    cache_write: float | None = None
    cache_write_1h: float | None = None

    @property
    def writes(self) -> tuple[float, float]:
        """The write prices of the two tiers."""
        short = self.input * WRITE_5M if self.cache_write is None else self.cache_write
        long = self.input * WRITE_1H if self.cache_write_1h is None else self.cache_write_1h
        return short, long


def price_for(table: list[Any], model: str) -> Price | None:
    """The first rule of ``table`` (``match``: a glob, input, cached_input, output,
    cache_write, cache_write_1h) matching ``model``; a rule without cached_input prices
    cached input as input."""
    for rule in table:
        if fnmatchcase(model, rule.match):
            cached = rule.input if rule.cached_input is None else rule.cached_input
            return Price(rule.input, cached, rule.output, rule.cache_write, rule.cache_write_1h)
    return None


def sides(entry: Entry, price: Price, summarizer: Price | None) -> tuple[float, float]:
    """USD ``entry`` would have cost without the proxy (the history as sent) and what it
    cost (what was sent, and the summaries at ``summarizer``'s prices; None: ``price``)."""
    short, long = price.writes
    s = summarizer or price
    wrote = entry.written_5m + entry.written_1h
    uncached = entry.sent - entry.cached - wrote
    paid = uncached * price.input + entry.cached * price.cached_input
    paid += entry.written_5m * short + entry.written_1h * long
    summarizer_uncached = entry.summarizer_input - entry.summarizer_cached
    paid += summarizer_uncached * s.input + entry.summarizer_cached * s.cached_input
    paid += entry.summarizer_output * s.output
    # The history as sent would have written what it did not read, at the tier the
    # request wrote at (the hour's only when it wrote nothing at 5 minutes).
    would_write = short if entry.written_5m or not entry.written_1h else long
    would_uncached = entry.would_send - entry.would_cached - entry.would_written
    would = would_uncached * price.input + entry.would_cached * price.cached_input
    would += entry.would_written * would_write
    return would / 1_000_000, paid / 1_000_000


# A provider's prompt cache lifetimes when no price rule names them: 5 minutes, an hour.
DEFAULT_TTLS = (300.0, 3600.0)


def cache_ttls(table: list[Any], model: str) -> tuple[float, float]:
    """How long ``model``'s provider keeps a prefix cached (5 minutes' tier, the hour's):
    its first matching rule's ``cache_ttl_s`` and ``cache_long_ttl_s``."""
    for rule in table:
        if fnmatchcase(model, rule.match):
            return rule.cache_ttl_s, rule.cache_long_ttl_s
    return DEFAULT_TTLS
