"""Prompt caching as Anthropic bills it, modelled: reads, writes by tier, expiry.

Anthropic's rules (its prompt caching guide): the prefix up to each ``cache_control``
breakpoint is written to the cache; a later request reads the longest prefix a
breakpoint of an earlier one wrote, while it lives: 5 minutes, or 1 hour when the
breakpoint asks ``{"type": "ephemeral", "ttl": "1h"}``, each use refreshing it.
``usage`` splits the prompt into ``cache_read_input_tokens``,
``cache_creation_input_tokens`` (up to the last breakpoint, past what was read) and
``input_tokens`` (the rest), and the writes by tier in
``cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}`` (a span
written belongs to the tier of the breakpoint that ends it). Sizes are pro rata of the
units' bytes. The two lifetimes are configurable (seconds, for tests), the clock
injectable; each request's outcome (core/cache_outcome.py) is judged from the
entries, as prompt_cache.py's: none seen, ``cold_start``; the furthest one seen
expired, ``ttl_expiry``; the one read the last breakpoint of an earlier prompt,
``hit``; else ``prefix_change`` (units sent without a breakpoint are remembered as
sent: a prompt that starts as an earlier one did is no cold start). A request
without breakpoints caches nothing (its outcome None).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import orjson
from cachetools import LRUCache

from proxy.core.cache_outcome import CacheOutcome
from proxy.simulator.anthropic_check import blocks

_CACHE_LIMIT = 65536
# A prefix of the prompt: its hash, its length in bytes, its breakpoint's tier (or None).
_Prefix = tuple[bytes, int, bool | None]
_LONG = "1h"


class AnthropicCache:
    """Prefix hashes written at ``cache_control`` breakpoints, with their expiry."""

    def __init__(
        self, ttl_s: float, long_ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = {False: ttl_s, True: long_ttl_s}
        self._clock = clock
        # hash -> (expiry, its lifetime, ended a prompt) at a breakpoint, None for a unit
        # sent without one: kept past expiry (until evicted), so an expiry is told apart
        # from a prefix never written, and a changed prompt from a new one.
        self._seen: LRUCache[bytes, tuple[float, float, bool] | None] = LRUCache(_CACHE_LIMIT)

    def clear(self) -> None:
        self._seen.clear()

    def usage(self, body: dict[str, Any], total: int) -> tuple[dict[str, Any], CacheOutcome | None]:
        """``total`` prompt tokens split as Anthropic's usage reports them, and why."""
        units = _units(body)
        size = sum(len(u) for u, _ in units) or 1
        hashes = _prefixes(units)
        marks = [i for i, (_, _, mark) in enumerate(hashes) if mark is not None]
        if not marks:
            return _usage(total, 0, (0, 0)), None
        now, last = self._clock(), marks[-1]
        sent_before = hashes[0][0] in self._seen
        live, seen = self._reach(hashes, last, now)
        ended = live >= 0 and (self._seen[hashes[live][0]] or (0.0, 0.0, False))[2]
        outcome = _outcome(sent_before, (live, seen), ended)
        read_bytes = hashes[live][1] if live >= 0 else 0
        if live >= 0:  # a read refreshes what it read, for its own lifetime
            _, lifetime, was_end = self._seen[hashes[live][0]] or (0.0, 0.0, False)
            self._seen[hashes[live][0]] = (now + lifetime, lifetime, was_end)
        long_bytes = self._write(hashes, last, read_bytes, now)
        read = total * read_bytes // size
        created = max(total * hashes[last][1] // size - read, 0)
        # Pro rata, but a write wholly at one tier is all that tier's (no rounding left over).
        written = max(hashes[last][1] - read_bytes, 1)
        long = created if long_bytes >= written else created * long_bytes // written
        return _usage(total, read, (created - long, long)), outcome

    def _reach(self, hashes: list[_Prefix], last: int, now: float) -> tuple[int, int]:
        """The furthest of ``hashes`` (up to ``last``) cached and alive, and the furthest
        cached at all, expired or not (-1: none)."""
        live, seen = -1, -1
        for i in range(last + 1):
            entry = self._seen.get(hashes[i][0])
            if entry is not None:  # cached once (expired or not)
                seen = i
                if entry[0] > now:
                    live = i
        return live, seen

    def _write(self, hashes: list[_Prefix], last: int, read_bytes: int, now: float) -> int:
        """Each prefix up to ``last`` written at its breakpoint (for its tier's lifetime),
        or remembered as sent; the bytes written past ``read_bytes`` at the hour's tier."""
        long_bytes, start = 0, 0
        for i in range(last + 1):
            state, end, mark = hashes[i]
            old = self._seen.get(state)
            if mark is None:  # sent, not cached: a later prompt from here is no cold start
                if state not in self._seen:
                    self._seen[state] = None
                continue
            if mark and end > read_bytes:
                long_bytes += end - max(start, read_bytes)
            start = end
            lifetime = self._ttl[mark]
            self._seen[state] = (
                now + lifetime,
                lifetime,
                i == last or (old is not None and old[2]),
            )
        return long_bytes


def _prefixes(units: list[tuple[bytes, bool | None]]) -> list[_Prefix]:
    """Each prefix of the prompt, unit by unit: its hash, its length in bytes, and the
    breakpoint that ends it (``_units``'s tier)."""
    state, at, hashes = b"", 0, []
    for unit, mark in units:
        state = hashlib.blake2b(state + unit, digest_size=16).digest()
        at += len(unit)
        hashes.append((state, at, mark))
    return hashes


def _outcome(sent_before: bool, reach: tuple[int, int], ended: bool) -> CacheOutcome:
    """From whether the prompt's first unit was ever sent, the furthest unit cached and
    alive and the furthest cached at all (-1: none), and whether the one read ended an
    earlier prompt."""
    live, seen = reach
    if not sent_before:
        return "cold_start"
    if seen > live:
        return "ttl_expiry"
    return "hit" if ended else "prefix_change"


def _usage(total: int, read: int, written: tuple[int, int]) -> dict[str, Any]:
    short, long = written
    return {
        "input_tokens": total - read - short - long,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": short + long,
        "cache_creation": {"ephemeral_5m_input_tokens": short, "ephemeral_1h_input_tokens": long},
    }


def _units(body: dict[str, Any]) -> list[tuple[bytes, bool | None]]:
    """The prompt in cacheable order (tools, system, messages' blocks): each unit's
    bytes without its ``cache_control``, and its breakpoint's tier (None: none; True:
    the hour's)."""
    out: list[tuple[bytes, bool | None]] = []

    def add(role: str, unit: object) -> None:
        mark: bool | None = None
        if isinstance(unit, dict) and "cache_control" in unit:
            control = unit["cache_control"]
            mark = isinstance(control, dict) and control.get("ttl") == _LONG
            unit = {k: v for k, v in unit.items() if k != "cache_control"}
        out.append((orjson.dumps([role, unit]), mark))

    for tool in body.get("tools") or []:
        add("tool", tool)
    for block in blocks(body.get("system")):
        add("system", block)
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            for block in blocks(message.get("content")):
                add(str(message.get("role")), block)
    return out
