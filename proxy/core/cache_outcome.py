"""Why a request's prompt cache read what it read: its ``CacheOutcome``, one closed set.

A provider bills a prompt in three parts: what its cache read, what it wrote, the rest.
Which of the misses cost money, and who caused them, is the ledger's question; the
simulator answers it for its own cache (it knows its entries), the ledger from what the
proxy saw of a session, and both use these words:

* ``cold_start``: nothing of this conversation was cached before (its first request);
* ``ttl_expiry``: the cache held the conversation's prefix, and it expired (idle past
  the provider's time to live);
* ``prefix_change``: the prompt no longer starts with the previous one: an edit, a
  rewind, or a view the proxy rebuilt (a new summary, trimming); ``cause`` says whose;
* ``hit``: the prompt starts with the previous prompt whole, cached and alive: the
  cache had all it could (below a provider's minimum that is still 0 tokens read).

``Sent`` is what the ledger keeps of one request to classify the next (pure values: the
clock is read by the caller).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Literal, get_args

CacheOutcome = Literal["hit", "ttl_expiry", "cold_start", "prefix_change"]
CACHE_OUTCOMES: tuple[CacheOutcome, ...] = get_args(CacheOutcome)
# Who made a prefix change: the proxy (the client's history went on, the view did not)
# or the client (its own history no longer starts with the previous one); "none" for
# the other outcomes. A closed set: a metric label.
Cause = Literal["proxy", "client", "none"]
CAUSES: tuple[Cause, ...] = get_args(Cause)


def prefix_print(digests: Sequence[bytes], upto: int) -> bytes:
    """A digest of the first ``upto`` message digests: a prefix's identity, 16 bytes."""
    return blake2b(b"".join(digests[:upto]), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the next one's cache sees it: the prefix the upstream received
    (its messages' count and print), the client's history likewise, when it was sent
    and how long the provider keeps what it cached then."""

    view: tuple[int, bytes]
    history: tuple[int, bytes]
    at: float
    ttl_s: float


def sent(view: Sequence[bytes], history: Sequence[bytes], at: float, ttl_s: float) -> Sent:
    """``Sent`` of a request whose view and history have these message digests."""
    return Sent(
        (len(view), prefix_print(view, len(view))),
        (len(history), prefix_print(history, len(history))),
        at,
        ttl_s,
    )


def _extends(digests: Sequence[bytes], before: tuple[int, bytes]) -> bool:
    count, print_ = before
    return len(digests) >= count and prefix_print(digests, count) == print_


def classify(
    before: Sent | None, view: Sequence[bytes], history: Sequence[bytes], at: float
) -> tuple[CacheOutcome, Cause]:
    """The cache outcome of a request sending ``view`` (message digests) for the client's
    ``history`` at ``at``, after ``before`` (None: the session's first request)."""
    if before is None:
        return "cold_start", "none"
    if at - before.at > before.ttl_s:
        return "ttl_expiry", "none"
    if _extends(view, before.view):
        return "hit", "none"
    return "prefix_change", "proxy" if _extends(history, before.history) else "client"
