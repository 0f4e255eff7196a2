"""How long each summarizer takes: learned from the proxy's own summaries, as windows
are learned from the upstream's errors, so a slow server is not rediscovered by every
session's turns.

A summary that finished records its time and its speed (output tokens a second, its
prompt's reading included); one dropped at its turn's deadline (turn_deadline.py) or timed
out records that it takes at least that long, and that the model writes fewer than the
tokens it was allowed in that time. Summaries are sized by that speed (fold.py asks for
at most ``affordable`` tokens): a slow server gets shorter summaries it can finish, not
the same long one that times out again, and one too slow for even the shortest summary
is not asked for it (turn_deadline.py counts it). A summary sized by such a bound that
runs out as well was given twice the time that bound says it needs: its time is not in
what it writes (a long prompt read cold, a loaded server), so a shorter one would not
finish either, and none is asked until the knowledge expires (a speed of 0: each turn
not asked is counted, none waits a deadline out again). What was learned is trusted for ``ttl_s``
(``compaction.backoff.max_s``; nothing with the back-off off), then the next
summary measures again: the server may have been given a core, or a lighter load. Per
process; per tenant and model, so one tenant's long spans never make another's summaries
look slow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache

from proxy.config import CompactionSettings

# Tenants and model names are the clients': the table is bounded.
_LIMIT = 4096
# The weight of the newest summary's time in the estimate: the last two count most.
_NEWEST = 0.5
# A sized summary may take this share of the time it is allowed: the rest is room for a
# retry (an answer cut off is asked again, tersely: summarize.py) and a slower moment.
_SHARE = 0.5


@dataclass(slots=True)
class _Pace:
    seconds: float  # a summary's expected time
    tokens_per_s: float | None  # its output speed, when an answer said how much it wrote
    until: float  # when this stops being trusted
    bound: bool = False  # tokens_per_s is an upper bound, from a summary that ran out


@dataclass(slots=True)
class SummaryPace:
    """Event loop only: no lock."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    entries: LRUCache[tuple[str, str], _Pace] = field(default_factory=lambda: LRUCache(_LIMIT))

    @classmethod
    def of(cls, settings: CompactionSettings) -> SummaryPace:
        """Trusted as long as the longest back-off; with the back-off off
        (``backoff.first_s: 0``) nothing is kept: every summary is asked in full."""
        return cls(settings.backoff.max_s if settings.backoff.first_s > 0 else 0.0)

    def finished(self, tenant: str, model: str, seconds: float, tokens: int | None) -> None:
        """A summary by ``model`` took ``seconds`` and wrote ``tokens`` (None: unknown)."""
        speed = tokens / seconds if tokens and seconds > 0 else None
        known, bound = self._known(tenant, model), False
        if known is not None:
            seconds = _NEWEST * seconds + (1 - _NEWEST) * known.seconds
            if speed is None:
                speed, bound = known.tokens_per_s, known.bound
        self.entries[tenant, model] = _Pace(seconds, speed, self.clock() + self.ttl_s, bound)

    def ran_out(
        self, tenant: str, model: str, seconds: float, max_tokens: int | None = None
    ) -> None:
        """A summary by ``model`` allowed ``max_tokens`` (None: unknown) was still
        unfinished after ``seconds``, and dropped or timed out."""
        known = self._known(tenant, model)
        speed = None if known is None else known.tokens_per_s
        bound = known is not None and known.bound
        if bound and speed and max_tokens and max_tokens <= speed * seconds:
            speed = 0.0  # sized by a bound, it ran out anyway: see the module's docstring
        elif max_tokens and seconds > 0:  # it wrote fewer than max_tokens in that time
            most = max_tokens / seconds
            speed, bound = (most if speed is None else min(speed, most)), True
        longest = seconds if known is None else max(seconds, known.seconds)
        self.entries[tenant, model] = _Pace(longest, speed, self.clock() + self.ttl_s, bound)

    def expected_s(self, tenant: str, model: str) -> float | None:
        """How long a summary by ``model`` takes, as far as the proxy knows now."""
        known = self._known(tenant, model)
        return None if known is None else known.seconds

    def speed(self, tenant: str, model: str) -> float | None:
        """``model``'s output tokens a second in its summaries, when measured."""
        known = self._known(tenant, model)
        return None if known is None else known.tokens_per_s

    def affordable(self, tenant: str, model: str, seconds: float) -> int | None:
        """The most output tokens to ask of ``model`` for a summary that must end within
        ``seconds``; None while its speed is not known."""
        speed = self.speed(tenant, model)
        return None if speed is None else int(speed * seconds * _SHARE)

    def _known(self, tenant: str, model: str) -> _Pace | None:
        known = self.entries.get((tenant, model))
        if known is None or known.until <= self.clock():
            return None
        return known
