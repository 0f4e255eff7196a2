"""Each request's prompt-cache outcome (core/cache_outcome.py), as the ledger judges it
from what the proxy saw of its session: the prefix the previous request sent, when, and
how long the provider keeps it (pricing's ``cache_ttl_s``, or ``cache_long_ttl_s`` after
a request that wrote only at the hour's tier), counted in series of its own; and whether
a session's last prompt is cached still (``warm``), which cache-aware cuts plan by
(compaction/held.py), with the plans they made (core/cache_cuts.py) counted here too.

What is kept: per session (bounded, least recently used dropped) the last request's
``Sent`` (core/cache_outcome.py). The view's message digests are the history's where
the view holds the history's own messages (the tail, the pinned ones) and computed for
the rest (a summary, an elided result), so a turn costs the few messages the proxy
wrote, not the view; a history sent uncounted has only the two messages its check
reads digested.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter

from proxy.core.cache_cuts import CACHE_PLANS, CachePlan
from proxy.core.cache_outcome import (
    CACHE_OUTCOMES,
    CAUSES,
    CacheOutcome,
    Cause,
    Sent,
    alive,
    classify,
    prefix_of,
)
from proxy.core.digest import message_digests, tenant_seed

if TYPE_CHECKING:
    from proxy.observe.record import Record
    from proxy.types import ChatMessage

_SESSIONS_LIMIT = 10_000
TIERS = ("5m", "1h")


class CacheLedger:
    """The last request of each session as its cache saw it, and the series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._sent: LRUCache[str, Sent] = LRUCache(_SESSIONS_LIMIT)
        self.outcomes = Counter(
            "compaction_proxy_cache_outcomes",
            "Chat requests by prompt-cache outcome (hit, ttl_expiry, cold_start, "
            "prefix_change) and, for a prefix change, who made it (proxy: a view it "
            "rebuilt; client: its own history changed; none)",
            ["outcome", "cause"],
            registry=registry,
        )
        self.written = Counter(
            "compaction_proxy_cache_written_tokens",
            "Input tokens the provider's cache wrote (its usage), by tier: 5m, 1h",
            ["tier"],
            registry=registry,
        )
        self.plans = Counter(
            "compaction_proxy_cache_plans",
            "Cache-aware turns with a snapshot newer than the view served last, by plan: "
            "held (the cached view served again), or applied: expired (the session idle "
            "past its cache's TTL), trigger, uncached, changed",
            ["plan"],
            registry=registry,
        )
        for plan in CACHE_PLANS:
            self.plans.labels(plan=plan)
        for outcome in CACHE_OUTCOMES:
            for cause in CAUSES:
                if (outcome == "prefix_change") == (cause != "none"):
                    self.outcomes.labels(outcome=outcome, cause=cause)
        for tier in TIERS:
            self.written.labels(tier=tier)

    def observe(
        self, rec: Record, session: str, ttls: tuple[float, float]
    ) -> tuple[CacheOutcome, Cause]:
        """The outcome of ``rec`` (a chat request the upstream answered) in ``session``,
        counted; ``ttls``: how long its provider keeps a prefix, at 5 minutes' tier and
        the hour's."""
        history = _history_digests(rec)
        outcome = rec.outcome
        view: _Known | _Lazy = history
        if outcome is not None and outcome.messages is not None:
            view = _view_digests(outcome.messages, rec, history)
        last = self._sent.get(session)
        found, cause = classify(last, view, history, rec.sent_at)
        short, long = rec.cache_writes or (0, 0)
        if long and not short:
            ttl = ttls[1]
        elif short or last is None:
            ttl = ttls[0]
        else:
            ttl = last.ttl_s
        self._sent[session] = Sent(prefix_of(view), prefix_of(history), rec.sent_at, ttl)
        self.outcomes.labels(outcome=found, cause=cause).inc()
        if short:
            self.written.labels(tier="5m").inc(short)
        if long:
            self.written.labels(tier="1h").inc(long)
        return found, cause

    def warm(self, session: str, now: float) -> bool:
        """Whether ``session``'s last prompt is still in its provider's cache at ``now``
        (sent within its TTL, as ``observe`` judges the next one); True when none is
        known here (nothing says it expired)."""
        last = self._sent.get(session)
        return last is None or alive(last, now)

    def planned(self, plan: CachePlan) -> None:
        self.plans.labels(plan=plan).inc()

    def forget(self, session: str) -> None:
        self._sent.pop(session, None)


class _Known:
    """Digests all at hand."""

    __slots__ = ("count", "full")

    def __init__(self, digests: Sequence[bytes]) -> None:
        self.count, self.full = len(digests), digests

    def at(self, index: int) -> bytes:
        return self.full[index]


class _Lazy:
    """A history sent uncounted: a message is digested when the check reads it."""

    __slots__ = ("_messages", "_seed", "count", "full")

    def __init__(self, messages: Sequence[ChatMessage], seed: int) -> None:
        self._messages, self._seed = messages, seed
        self.count, self.full = len(messages), None

    def at(self, index: int) -> bytes:
        return message_digests([self._messages[index]], self._seed)[0]


def _history_digests(rec: Record) -> _Known | _Lazy:
    """The client's history's message digests: the ones counting made, else (a request
    sent uncounted, far below the trigger) its messages', each when read."""
    if rec.digests is not None:
        return _Known(rec.digests)
    return _Lazy(rec.messages or [], tenant_seed(rec.tenant))


def _view_digests(messages: Sequence[ChatMessage], rec: Record, history: _Known | _Lazy) -> _Known:
    """A view's message digests: the history's for its own messages, computed for the
    messages the proxy wrote."""
    own = rec.messages or []
    index = {id(m): i for i, m in enumerate(own)}
    digests: list[bytes] = []
    fresh: list[tuple[int, ChatMessage]] = []
    for message in messages:
        i = index.get(id(message))
        if i is not None and i < history.count and own[i] is message:
            digests.append(history.at(i))
        else:
            fresh.append((len(digests), message))
            digests.append(b"")
    if fresh:
        seed = tenant_seed(rec.tenant)
        computed = message_digests([m for _, m in fresh], seed)
        for (at, _), digest in zip(fresh, computed, strict=True):
            digests[at] = digest
    return _Known(digests)
