"""Prompt caching as OpenAI bills it, modelled: ``cached_tokens`` for a repeated prefix.

OpenAI's rules (its prompt caching guide and the "Prompt Caching 201" cookbook): caching
is automatic for prompts of 1024 tokens or more; a hit needs an exact, repeated prefix
of a recent request (the cache is cleared after minutes of inactivity) and is reported
in increments of 128 tokens, as ``usage.prompt_tokens_details.cached_tokens`` (chat) or
``usage.input_tokens_details.cached_tokens`` (Responses).

What the simulator models (``PromptCacheConfig``):

* the cache is per API key (the ``Authorization`` header, hashed): another key's
  identical prompt is a miss, as OpenAI's caches are per organization;
* a prompt is a chain of blocks, the tool definitions first, then each message in order;
  the prefix that hits is the longest chain of whole blocks a request of the same key
  sent within ``ttl_s`` (a block that differs at all ends it: no partial message);
* ``cached_tokens`` is that prefix's tokens (times the model's ``token_scale``) rounded
  down to a multiple of ``increment``, 0 below ``min_tokens`` or for a prompt shorter
  than ``min_tokens``, and never more than the prompt;
* a request that failed (an overflow, a rejected body) caches nothing;
* each lookup says why it read what it read (core/cache_outcome.py), from the cache's
  own entries: no block of the prompt ever seen, ``cold_start``; a block seen but
  expired, ``ttl_expiry``; the last block alive the end of an earlier prompt, ``hit``;
  else (an earlier prompt went on differently from there) ``prefix_change``.

The clock is injectable (``clock``) so unit tests can step past a TTL; e2e tests
configure one of seconds.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

import orjson
from cachetools import LRUCache

from proxy.core.cache_outcome import CacheOutcome
from proxy.simulator.counting import PromptCounter

# Prefixes remembered at once, across keys: a benchmark's many conversations stay bounded.
_MAX_PREFIXES = 200_000


def cached_share(prefix: int, total: int, min_tokens: int, increment: int) -> int:
    """The cached tokens of a ``total``-token prompt whose first ``prefix`` tokens repeat."""
    if total < min_tokens or prefix < min_tokens:
        return 0
    return min(prefix - prefix % increment, total)


class PromptCache:
    """Recent prompt prefixes per API key, as chained digests with their expiry and
    whether one ended a prompt (what a later prompt's outcome is judged by)."""

    def __init__(
        self,
        *,
        ttl_s: float,
        min_tokens: int,
        increment: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._min = min_tokens
        self._step = increment
        self._clock = clock
        # digest -> (expiry, ended a prompt); expired entries stay until evicted, so an
        # expiry is told apart from a prefix never sent.
        self._seen: LRUCache[bytes, tuple[float, bool]] = LRUCache(_MAX_PREFIXES)

    def clear(self) -> None:
        self._seen.clear()

    def lookup(
        self, key: str, blocks: Sequence[tuple[object, int]], total: int
    ) -> tuple[int, CacheOutcome | None]:
        """The cached tokens of a prompt of ``blocks`` (each a JSON value and its tokens)
        totalling ``total`` tokens, sent with ``key``, and why (None: caching is off);
        remembers its prefixes."""
        if self._ttl_s <= 0:
            return 0, None
        now = self._clock()
        chain = hashlib.blake2b(key.encode(), digest_size=16).digest()
        prefix, live, seen, ended = 0, 0, 0, False
        digests: list[tuple[bytes, bool]] = []
        for value, tokens in blocks:
            chain = hashlib.blake2b(chain + orjson.dumps(value), digest_size=16).digest()
            entry = self._seen.get(chain)
            digests.append((chain, entry is not None and entry[1]))
            if entry is not None and seen == len(digests) - 1:
                seen += 1
                if live == seen - 1 and entry[0] > now:
                    live, ended = seen, entry[1]
                    prefix += tokens
        last = len(digests) - 1
        for i, (digest, was_end) in enumerate(digests):
            self._seen[digest] = (now + self._ttl_s, was_end or i == last)
        return cached_share(prefix, total, self._min, self._step), _outcome(seen, live, ended)


def _outcome(seen: int, live: int, ended: bool) -> CacheOutcome:
    """A lookup's outcome from its leading blocks seen (expired or not) and alive, and
    whether the last alive one ended an earlier prompt."""
    if seen == 0:
        return "cold_start"
    if seen > live:
        return "ttl_expiry"
    return "hit" if ended else "prefix_change"


def chat_blocks(
    counter: PromptCounter, messages: Sequence[object], tools: int, defs: object
) -> list[tuple[object, int]]:
    """A chat prompt as cache blocks: its tool definitions (``tools`` tokens), then each
    message with its tokens."""
    blocks: list[tuple[object, int]] = [(defs, tools)] if tools else []
    for message in messages:
        if isinstance(message, dict):
            blocks.append((message, counter.message(message)))
    return blocks
