"""Context windows learned from upstream overflow errors.

Configured windows are often wrong (a self-hosted model started with a
smaller ``max_model_len``, a provider that counts differently). When an
upstream rejects a request as too long, the limit it states, converted to
the proxy's own token units, is remembered per upstream and model, in the
store so every replica benefits, with an expiry so a reconfigured server is
trusted again later. Requests then plan against min(configured, learned).

What one caller's error teaches applies to that caller (its tenant) at once:
it can only ever shrink its own window. A shared window, every tenant's, is
lowered only when

* the upstream stated the limit in its own words (not a bare 413, not text it
  echoed from the request: ``recover.py`` decides, ``overflow.echoed``);
* ``quorum`` distinct tenants reported a limit within ``_VOTE_S`` (the shared
  window becomes the largest of their reports: the one they all agree on);
* the last lowering of that model's shared window is older than
  ``interval_s`` (a marker in the store, so replicas agree); and
* it drops by at most half of the current shared (or configured) window.

So no single caller, however many requests it sends, can shrink everyone's
window, and a burst of forged reports from several keys moves it slowly.

Lookups sit on the request path, so each replica keeps what it read for a
few seconds instead of asking the store on every request.

Keys (the local cache's and the store's) are :func:`window_key`: every part
length-prefixed, so no model name can spell another model's key plus a tenant
(``vm|anonymous`` was once every keyless caller's window of ``vm``). Keys in the
older ``upstream|model[|tenant]`` form are no longer read; they expire.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from cachetools import LRUCache, TTLCache

from proxy.config import Settings
from proxy.core.models import ResolvedModel
from proxy.observe.metrics import Metrics
from proxy.redact import redact_url
from proxy.store import WindowStore

log = logging.getLogger("proxy.windows")

_LOCAL_S = 5.0
_LOCAL_LIMIT = 10_000  # model names come from clients, capped in bytes at parse
TENANT_TTL_S = 3600.0
# Never learn a window so small that nothing useful fits.
MIN_WINDOW = 512
# Reports older than this no longer count towards a quorum.
_VOTE_S = 3600.0
_VOTERS_LIMIT = 64  # per model: far more than any quorum, bounded against forged tenants
_VOTED_MODELS = 1_000
# Marks a recent shared lowering, after a shared window's key; no key ends with it, as
# every key ends with a whole length-prefixed part.
LOWERED_MARKER = "|!lowered"
# Versions the key layout: keys of the old, ambiguous ``upstream|model|tenant`` layout
# never start with it (an upstream URL starts with a scheme).
_KEY_PREFIX = "w2|"


def window_key(
    upstream: str, model: str, tenant: str | None = None, prefix: str = _KEY_PREFIX
) -> str:
    """The key of ``model``'s window at ``upstream``, shared (``tenant`` None) or one
    tenant's: ``w2|`` (``prefix``: another limit's) and each part as ``<length>:<text>``,
    so no two distinct triples share a key whatever their text holds."""
    parts = (upstream, model) if tenant is None else (upstream, model, tenant)
    return prefix + "".join(f"{len(part)}:{part}" for part in parts)


def parse_window_key(key: str, prefix: str = _KEY_PREFIX) -> tuple[str, str, str | None] | None:
    """``window_key``'s parts back (upstream, model, tenant), or None for any other key
    (an old-layout key, a lowering marker, another limit's ``prefix``)."""
    if not key.startswith(prefix):
        return None
    parts: list[str] = []
    at = len(prefix)
    while at < len(key) and len(parts) < 3:
        colon = key.find(":", at)
        digits = key[at:colon]
        if colon == -1 or not digits.isascii() or not digits.isdigit():
            return None
        start, at = colon + 1, colon + 1 + int(digits)
        if at > len(key):
            return None
        parts.append(key[start:at])
    if at != len(key) or len(parts) < 2:
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """Where learned windows are kept and how readily a shared one is lowered."""

    upstream: str  # windows are learned per upstream: part of every key
    ttl_s: float
    quorum: int = 2
    interval_s: float = 600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> WindowPolicy:
        c = settings.compaction
        return cls(
            # Part of every key in a shared store: a key in the URL's query stays out of it.
            upstream=redact_url(settings.upstream.base_url),
            ttl_s=c.learned_windows.ttl_s,
            quorum=c.learned_windows.quorum,
            interval_s=c.learned_windows.interval_s,
        )


_MISSING = object()  # not read lately


class _Recent:
    """What the store said of each key (a window, or None: nothing learned) in the last
    ``_LOCAL_S``, for at most ``_LOCAL_LIMIT`` keys: a dict and a deadline per key, read
    on every request (cachetools' TTLCache cost several calls a read)."""

    __slots__ = ("_clock", "_entries")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[int | None, float]] = {}

    def get(self, key: str) -> Any:
        """The value kept for ``key``, or ``_MISSING`` (never kept, or expired)."""
        entry = self._entries.get(key)
        if entry is None or entry[1] <= self._clock():
            return _MISSING
        return entry[0]

    def put(self, key: str, value: int | None) -> None:
        entries, now = self._entries, self._clock()
        entries.pop(key, None)  # to the end: the oldest entries come first
        # Every entry lives _LOCAL_S from its put, and a put goes to the end: the dict is in
        # expiry order, so the expired are at its front (no scan of a full dict per miss).
        while len(entries) >= _LOCAL_LIMIT:
            del entries[next(iter(entries))]  # expired or, all fresh, the oldest
        entries[key] = (value, now + _LOCAL_S)


class LearnedWindows:
    # What is learned (a subclass learns another limit the same way: ceilings.py), the
    # smallest value ever learned, and the key layout's prefix.
    NOUN = "context window"
    FLOOR = MIN_WINDOW
    PREFIX = _KEY_PREFIX

    def __init__(
        self,
        store: WindowStore,
        policy: WindowPolicy,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._upstream = policy.upstream
        self._ttl = policy.ttl_s
        self._metrics = metrics
        self._quorum = policy.quorum
        self._interval = policy.interval_s
        self._clock = clock
        # Used only on the event loop: no lock, although LRU hits reorder the caches.
        self._local = _Recent(clock)
        self._keys: dict[tuple[str, str | None], str] = {}  # (model, tenant) -> window_key
        # model -> tenant -> limit: this replica's view of the quorum. A report
        # expires after _VOTE_S; a tenant reporting again starts its clock anew.
        self._votes: LRUCache[str, TTLCache[str, int]] = LRUCache(_VOTED_MODELS)

    def _key(self, model: str, tenant: str | None) -> str:
        key = self._keys.get((model, tenant or None))
        if key is None:
            if len(self._keys) >= _LOCAL_LIMIT:
                self._keys.clear()
            tenant = tenant or None
            key = window_key(self._upstream, model, tenant, self.PREFIX)
            self._keys[model, tenant] = key
        return key

    async def _read(self, key: str) -> int | None:
        kept = self._local.get(key)  # None too: "nothing learned" is worth keeping
        if kept is not _MISSING:
            return cast("int | None", kept)
        # never read, or read more than _LOCAL_S ago
        value = await self._store.load_window(key)
        self._local.put(key, value)
        return value

    async def _write(self, key: str, tokens: int, ttl_s: float) -> None:
        await self._store.save_window(key, tokens, ttl_s)
        self._local.put(key, tokens)

    async def get(self, model: str, tenant: str | None = None) -> int | None:
        """The smallest window learned for ``model``, for everyone or for ``tenant``."""
        shared = await self._read(self._key(model, None))
        own = await self._read(self._key(model, tenant)) if tenant else None
        known = [w for w in (shared, own) if w is not None]
        return min(known) if known else None

    def known(self, model: ResolvedModel, tenant: str) -> ResolvedModel | None:
        """What ``apply`` returns, when both windows were read lately (every request but
        the first in _LOCAL_S): no store, no coroutine. None: ``apply`` must read."""
        read, learned = self._recent(model.name, tenant)
        return _within(model, learned) if read else None

    def _recent(self, model: str, tenant: str) -> tuple[bool, int | None]:
        """Whether both of ``model``'s values (everyone's, ``tenant``'s) were read lately,
        and then the smaller of those learned."""
        shared = self._local.get(self._key(model, None))
        own = self._local.get(self._key(model, tenant)) if tenant else None
        if shared is _MISSING or own is _MISSING:
            return False, None
        return True, own if shared is None else shared if own is None else min(shared, own)

    async def apply(self, model: ResolvedModel, tenant: str) -> ResolvedModel:
        known = self.known(model, tenant)
        return known or _within(model, await self.get(model.name, tenant))

    async def learn(
        self, model: str, tokens: int, tenant: str, *, configured: int, stated: int | None
    ) -> int:
        """Record that ``model`` holds at most ``tokens`` for ``tenant``; returns the window
        now in force for that tenant. ``stated``: the limit exactly as the upstream stated
        it, which also counts as the tenant's report towards a shared window. (``tokens``
        may be scaled by how the caller's request counted, which the caller controls, so
        only the upstream's own number is ever shared.)"""
        tokens = max(tokens, self.FLOOR)
        current = await self.get(model, tenant)
        if stated is not None and stated < configured:  # at or above it, the config is right
            await self._report(model, tenant, max(stated, self.FLOOR), configured)
        if current is not None and current <= tokens:
            return current
        ttl = self._ttl if stated is not None else TENANT_TTL_S
        await self._write(self._key(model, tenant), tokens, ttl)
        self._counted("tenant", model, tokens)
        # %r: the name is the client's text; a newline in it must not start a forged line.
        log.warning("learned %s for model %r (one tenant): %d tokens", self.NOUN, model, tokens)
        return tokens

    async def _report(self, model: str, tenant: str, tokens: int, configured: int) -> None:
        voters = self._votes.get(model)
        if voters is None:
            voters = self._votes[model] = TTLCache(_VOTERS_LIMIT, _VOTE_S, timer=self._clock)
        voters[tenant] = tokens  # drops expired reports first; when full, the stalest voter
        # One instant for the count and the max, so no report expires between them.
        with voters.timer:
            agreeing = len(voters)
            if agreeing < self._quorum:
                return
            agreed = max(voters.values())
        shared_key = self._key(model, None)
        shared = await self._read(shared_key)
        current = min(shared, configured) if shared is not None else configured
        if agreed >= current:
            return
        marker = f"{shared_key}{LOWERED_MARKER}"
        if self._interval > 0 and await self._store.load_window(marker) is not None:
            return  # lowered recently: the next lowering waits, whoever asks
        lowered = max(agreed, current // 2, self.FLOOR)
        await self._write(shared_key, lowered, self._ttl)
        if self._interval > 0:
            await self._store.save_window(marker, lowered, self._interval)
        self._counted("shared", model, lowered)
        log.warning(
            "learned %s for model %r (all callers, %d tenants agree): %d tokens",
            self.NOUN,
            model,
            agreeing,
            lowered,
        )

    def _counted(self, scope: str, model: str, tokens: int) -> None:
        if scope == "shared":
            self._metrics.learned_window.labels(model=model).set(tokens)
        self._metrics.learned_windows.labels(scope=scope).inc()


def _within(model: ResolvedModel, learned: int | None) -> ResolvedModel:
    """``model`` with the window ``learned``, when that is smaller than its own."""
    if learned is None or learned >= model.context_window:
        return model
    return replace(model, context_window=learned, source="learned")
