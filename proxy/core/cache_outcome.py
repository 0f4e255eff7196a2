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
clock is read by the caller): of each prompt, the whole prefix's print where every
message digest was at hand (a counted history, a view), else its first and last
message's (a history sent uncounted, far below the trigger, is never digested whole).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Literal, Protocol, get_args

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


class Digests(Protocol):
    """A prompt's message digests: all of them at hand (``full``), or one at a time
    (``at``: a request sent uncounted digests only the messages its check reads)."""

    @property
    def count(self) -> int: ...

    @property
    def full(self) -> Sequence[bytes] | None: ...

    def at(self, index: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Prefix:
    """A prompt's messages as the next request's check reads them: how many, the first's
    and the last's digests, and the whole prefix's print when all digests were at hand."""

    count: int
    first: bytes
    last: bytes
    whole: bytes | None


def prefix_of(digests: Digests) -> Prefix:
    count, full = digests.count, digests.full
    if count == 0:
        return Prefix(0, b"", b"", b"")
    whole = None if full is None else prefix_print(full, count)
    return Prefix(count, digests.at(0), digests.at(count - 1), whole)


def extends(digests: Digests, before: Prefix) -> bool:
    """Whether a prompt of ``digests`` starts with the prefix ``before``: by its whole
    print when both sides had every digest, else by its first and last message."""
    if digests.count < before.count:
        return False
    if before.count == 0:
        return True
    if digests.full is not None and before.whole is not None:
        return prefix_print(digests.full, before.count) == before.whole
    return digests.at(0) == before.first and digests.at(before.count - 1) == before.last


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the next one's cache sees it: the prefix the upstream received,
    the client's history likewise, when it was sent and how long the provider keeps
    what it cached then."""

    view: Prefix
    history: Prefix
    at: float
    ttl_s: float


def alive(before: Sent, at: float) -> bool:
    """Whether the prefix ``before`` sent is still cached at ``at``: used within its TTL."""
    return at - before.at <= before.ttl_s


def classify(
    before: Sent | None, view: Digests, history: Digests, at: float
) -> tuple[CacheOutcome, Cause]:
    """The cache outcome of a request sending ``view`` for the client's ``history`` at
    ``at``, after ``before`` (None: the session's first request)."""
    if before is None:
        return "cold_start", "none"
    if not alive(before, at):
        return "ttl_expiry", "none"
    if extends(view, before.view):
        return "hit", "none"
    return "prefix_change", "proxy" if extends(history, before.history) else "client"
