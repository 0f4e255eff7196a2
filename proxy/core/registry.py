"""A maintained model registry as one lookup: a model name to its window, output limit and
list prices, for models no ``models:`` entry names.

The figures come from a package (``upstream/registry.py`` reads it once, at start-up);
this module only indexes them. One model id is often listed by many hosts, with figures
that differ (a gateway may cap a model lower than its maker does): the maker's own listing
wins, and among hosts only, the figures most of them agree on (a tie: the smaller window,
the cautious guess).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

# Whose listing of a model is the model's own: its maker's API, first to last.
_MAKERS = (
    "openai",
    "anthropic",
    "google",
    "deepseek",
    "mistral",
    "xai",
    "cohere",
    "moonshotai",
    "zai",
    "alibaba",
    "minimax",
    "llama",
)


@dataclass(frozen=True, slots=True)
class Prices:
    """List prices in USD per million tokens (None: not listed)."""

    input: float | None = None
    output: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True, slots=True)
class Listing:
    """One model as one provider lists it."""

    model: str
    context_window: int
    max_output_tokens: int | None
    prices: Prices | None = None


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    context_window: int
    max_output_tokens: int | None
    prices: Prices | None
    provider: str  # whose listing the figures are


class Registry:
    """Model names (lower-cased, and the last part of a ``vendor/model`` id) to their
    entry. Built once; ``lookup`` is two dict reads at most."""

    __slots__ = ("_entries", "release")

    def __init__(self, entries: dict[str, RegistryEntry], release: str) -> None:
        self._entries = entries
        self.release = release  # the package and version the figures are from, for check-config

    @classmethod
    def empty(cls) -> Registry:
        return cls({}, "none")

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, model: str) -> RegistryEntry | None:
        """``model``'s entry: its exact id (any case), else, for ``vendor/model`` or a
        gateway's ``provider/vendor/model``, the id after the last ``/``."""
        name = model.lower()
        hit = self._entries.get(name)
        if hit is None and "/" in name:
            hit = self._entries.get(name.rsplit("/", 1)[1])
        return hit


def build_registry(providers: Iterable[tuple[str, Iterable[Listing]]], release: str) -> Registry:
    """The registry of every provider's listings (provider id, its models)."""
    found: dict[str, list[tuple[str, Listing]]] = {}
    for provider, listings in providers:
        for listing in listings:
            if listing.context_window <= 0:
                continue
            for name in _names(listing.model, maker=provider in _MAKERS):
                found.setdefault(name, []).append((provider, listing))
    return Registry({name: _chosen(seen) for name, seen in found.items()}, release)


def _names(model: str, *, maker: bool) -> tuple[str, ...]:
    """The names a listing is found by. From a host, only names with a digit: a model's
    id has a version or a size, while gateways list bare words (``auto``, ``router``,
    ``small``) that are their own aliases, not a model, and that a local server may use
    for any. A maker's own ids (``deepseek-chat``) are names whatever they look like."""
    name = model.lower()
    names = (name, name.rsplit("/", 1)[1]) if "/" in name else (name,)
    return names if maker else tuple(n for n in names if any(c.isdigit() for c in n))


def _chosen(seen: list[tuple[str, Listing]]) -> RegistryEntry:
    makers = [(p, listing) for p, listing in seen if p in _MAKERS]
    if makers:
        provider, listing = min(makers, key=lambda item: _MAKERS.index(item[0]))
        return _entry(provider, listing)
    figures = Counter((listing.context_window, listing.max_output_tokens) for _, listing in seen)
    (window, output), _ = max(figures.items(), key=lambda item: (item[1], -item[0][0]))
    provider, listing = next(
        (p, li) for p, li in seen if (li.context_window, li.max_output_tokens) == (window, output)
    )
    return _entry(provider, listing)


def _entry(provider: str, listing: Listing) -> RegistryEntry:
    output = listing.max_output_tokens
    return RegistryEntry(
        context_window=listing.context_window,
        max_output_tokens=output if output and output > 0 else None,
        prices=listing.prices,
        provider=provider,
    )
