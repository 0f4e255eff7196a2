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
* a request that failed (an overflow, a rejected body) caches nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import orjson
from cachetools import LRUCache

from proxy.simulator.counting import PromptCounter

# Prefixes remembered at once, across keys: a benchmark's many conversations stay bounded.
_MAX_PREFIXES = 200_000


def cached_share(prefix: int, total: int, min_tokens: int, increment: int) -> int:
    """The cached tokens of a ``total``-token prompt whose first ``prefix`` tokens repeat."""
    if total < min_tokens or prefix < min_tokens:
        return 0
    return min(prefix - prefix % increment, total)


class PromptCache:
    """Recent prompt prefixes per API key, as chained digests with their expiry."""

    def __init__(self, *, ttl_s: float, min_tokens: int, increment: int) -> None:
        self._ttl_s = ttl_s
        self._min = min_tokens
        self._step = increment
        self._seen: LRUCache[bytes, float] = LRUCache(_MAX_PREFIXES)  # digest -> expiry

    def clear(self) -> None:
        self._seen.clear()

    def lookup(self, key: str, blocks: Sequence[tuple[object, int]], total: int) -> int:
        """The cached tokens of a prompt of ``blocks`` (each a JSON value and its tokens)
        totalling ``total`` tokens, sent with ``key``; remembers its prefixes."""
        if self._ttl_s <= 0:
            return 0
        now = time.monotonic()
        chain = hashlib.blake2b(key.encode(), digest_size=16).digest()
        prefix, hit, digests = 0, True, []
        for value, tokens in blocks:
            chain = hashlib.blake2b(chain + orjson.dumps(value), digest_size=16).digest()
            digests.append(chain)
            if hit and self._seen.get(chain, 0.0) > now:
                prefix += tokens
            else:
                hit = False
        for digest in digests:
            self._seen[digest] = now + self._ttl_s
        return cached_share(prefix, total, self._min, self._step)


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
