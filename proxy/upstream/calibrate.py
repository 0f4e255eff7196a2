"""Correct token estimates with the provider's own count (the truth).

Answers report ``usage.prompt_tokens`` (``usage.input_tokens`` in the Responses
API). Comparing it with what the proxy
counted for the same request gives, per model, how far our tokenizer is off
(a different vocabulary, hidden template tokens). Planning then scales the
window down by that factor when we under-count; over-counting only makes
compaction start a little early and is left alone.

What a request contains is the caller's choice, and some parts count very
differently upstream (files, audio), so one caller could skew the ratio for
everyone: each tenant keeps its own, learned from its own requests only.

Usage is found by a byte scan of the relayed answer, never by parsing or
re-serializing it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from proxy.core.ledger import find_cache_writes, find_cached_tokens
from proxy.core.models import ResolvedModel
from proxy.core.outcome import Outcome, Turn
from proxy.observe.record import current_record

_USAGE = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,9})')
_INPUT_TOKENS = re.compile(rb'"input_tokens"\s*:\s*(\d{1,9})')
_ALPHA = 0.2  # weight of a new observation in the moving average
_CLAMP = (0.5, 2.0)
# Below this many tokens fixed overheads dominate and the ratio means little.
_MIN_TOKENS = 256
# Tenants and model names come from clients: bounded in entries, and in bytes since a
# tenant is a fixed-size hash and parsing caps a model name (server.max_model_bytes).
_KEYS_LIMIT = 10_000


def find_prompt_tokens(chunk: bytes) -> int | None:
    # The search alone: a ``prompt_tokens`` ``in`` check before it scanned a reply twice
    # (249 bytes: 1.40 -> 0.76 µs; bench/README.md, "... the compacting route, second pass").
    m = _USAGE.search(chunk)
    return int(m.group(1)) if m else None


def find_input_tokens(chunk: bytes) -> int | None:
    """``find_prompt_tokens`` for a Responses API answer."""
    if b"input_tokens" not in chunk:
        return None
    m = _INPUT_TOKENS.search(chunk)
    return int(m.group(1)) if m else None


class Calibration:
    def __init__(self) -> None:
        # Least recently used first (a read counts as use); only ever used on the event
        # loop, so no lock. A plain dict, as ModelTable's: cachetools' LRUCache took three
        # Python calls a miss and five a hit, on every request (issue 27).
        self._ratio: dict[tuple[str, str], float] = {}
        self._limit = _KEYS_LIMIT

    def observe(self, tenant: str, model: str, ours: int, theirs: int) -> None:
        if ours < _MIN_TOKENS or theirs <= 0:
            return
        ratio = min(max(theirs / ours, _CLAMP[0]), _CLAMP[1])
        ratios, key = self._ratio, (tenant, model)
        old = ratios.pop(key, None)
        if old is None:
            while len(ratios) >= self._limit:
                del ratios[next(iter(ratios))]  # the least recently used
        ratios[key] = ratio if old is None else old + _ALPHA * (ratio - old)

    def factor(self, tenant: str, model: str) -> float:
        """How many provider tokens one of ours is worth, when we under-count (else 1)."""
        ratios, key = self._ratio, (tenant, model)
        ratio = ratios.pop(key, None)
        if ratio is None:
            return 1.0
        ratios[key] = ratio  # to the end: the most recently used
        return max(ratio, 1.0)

    def apply(self, model: ResolvedModel, tenant: str) -> ResolvedModel:
        """``model`` with its configured window in the proxy's own token units for this
        tenant: if we under-count, the window holds fewer of our tokens."""
        factor = self.factor(tenant, model.name)
        if factor <= 1.0:
            return model
        return replace(model, context_window=int(model.context_window / factor))

    def watcher(
        self, prompt_tokens: Callable[[bytes], int | None], turn: Turn | None, outcome: Outcome
    ) -> Callable[[bytes], None]:
        """What reads an answer to ``outcome`` (the view of ``turn``; None: not compacted)
        chunk by chunk: the provider's prompt, cached and cache-write tokens to the
        request's ledger, and its prompt count to ``observe`` when ours was a count."""
        record, calibrate = current_record(), turn is not None and outcome.counted
        tenant, model = (turn.tenant, turn.model.name) if turn is not None else ("", "")

        def watch(chunk: bytes) -> None:
            theirs = prompt_tokens(chunk)
            if theirs is not None:
                record.used(theirs, find_cached_tokens(chunk), find_cache_writes(chunk))
                if calibrate:
                    self.observe(tenant, model, outcome.tokens, theirs)

        return watch
