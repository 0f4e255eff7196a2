"""A shared store's health as one replica sees it from its own calls: ``Health``, the
value ``/readyz`` reports, and ``StoreWatch``, which keeps it, counts and logs.

A store is failing from a failed call until a *write* succeeds again: a read-only
replica or a full Redis (``maxmemory`` with ``noeviction``) answers reads and PINGs,
so neither proves that snapshots are shared again. A store that did not answer (no
connection, a timeout, bad credentials; anything unrecognised) is left alone for a
short cool-down, so no request waits on a dead server more than once per cool-down;
one that answered with a refusal (MOVED, READONLY, OOM...) costs a round trip, so every
call still tries it, and each failure is counted. Each cause is logged when first met
and then at most once per interval; "shared again" once, when writes succeed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from proxy.observe.store_series import StoreSeries

log = logging.getLogger("proxy.store")

COOLDOWN_S = 2.0
LOG_INTERVAL_S = 30.0
# /readyz writes a probe when no write (nor any failure) was seen for this long.
PROBE_AFTER_S = 2.0
# Kinds where the store answered at once (a wrong node, a replica, a full or refusing
# server): trying it costs a round trip, not a timeout, so every call still tries it.
ANSWERED = frozenset({"moved", "readonly", "oom", "crossslot", "noperm"})
# Kinds where the store did not answer this replica at all.
UNREACHABLE = frozenset({"timeout", "connection", "auth"})
# Operations that write: the only ones whose success ends a failure.
WRITES = frozenset({"save", "delete", "acquire", "release", "save_window", "note_seen", "probe"})


@dataclass(frozen=True, slots=True)
class Health:
    """What a store's recent calls say of it: ok (``cause`` None), or the kind of the
    last failure they met (``observe.series.STORE_FAILURE_KINDS``)."""

    cause: str | None = None

    @property
    def ok(self) -> bool:
        return self.cause is None

    def __str__(self) -> str:
        """``ok``, ``degraded (readonly)``, ``unreachable (connection)``..."""
        if self.cause is None:
            return "ok"
        state = "unreachable" if self.cause in UNREACHABLE else "degraded"
        return f"{state} ({self.cause})"


class Reports:
    """Log lines by subject, each at most once per ``LOG_INTERVAL_S``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # when last logged, how many since

    def due(self, subject: str) -> str | None:
        """None if ``subject`` was logged within the interval (counted); else what to add
        to its line: how many were left out since the last one."""
        now = self._clock()
        last, suppressed = self._last.get(subject, (-LOG_INTERVAL_S, 0))
        if now - last < LOG_INTERVAL_S:
            self._last[subject] = (last, suppressed + 1)
            return None
        self._last[subject] = (now, 0)
        return f" ({suppressed} more since the last report)" if suppressed else ""

    def clear(self) -> None:
        self._last.clear()


class StoreWatch:
    """The shared store's health from this replica's calls: ``failed`` and ``succeeded``
    after each one, ``fell_back`` for each served from local state instead."""

    def __init__(self, series: StoreSeries, clock: Callable[[], float]) -> None:
        self._series = series
        self._clock = clock
        self.cause: str | None = None
        self._cooling_until = 0.0
        self._last_seen = -PROBE_AFTER_S  # a write's outcome or any failure
        self._reports = Reports(clock)  # by cause
        series.degraded.set(0)

    @property
    def cooling(self) -> bool:
        """In the cool-down after a failure of a store that did not answer: don't try it."""
        return self._clock() < self._cooling_until

    @property
    def health(self) -> Health:
        return Health(self.cause)

    @property
    def stale(self) -> bool:
        """No write nor failure seen lately: a probe would tell more than the last one."""
        return self._clock() - self._last_seen >= PROBE_AFTER_S

    def failed(self, op: str, kind: str, exc: BaseException) -> None:
        now = self._clock()
        self._series.errors.labels(operation=op).inc()
        self._series.failures.labels(kind=kind).inc()
        self._series.degraded.set(1)
        self.cause = kind
        self._last_seen = now
        if kind not in ANSWERED:
            self._cooling_until = now + COOLDOWN_S
        extra = self._reports.due(kind)
        if extra is None:
            return
        log.warning(
            "store unavailable (%s: %s failed: %s); serving from local state until its "
            "writes succeed again%s",
            kind,
            op,
            exc,
            extra,
        )

    def succeeded(self, op: str) -> None:
        if op not in WRITES:
            return  # a replica or a full Redis still answers reads
        self._last_seen = self._clock()
        if self.cause is None:
            return
        log.warning(
            "store reachable again (%s succeeded after %s); snapshots are shared across "
            "replicas once more",
            op,
            self.cause,
        )
        self.cause = None
        self._cooling_until = 0.0
        self._reports.clear()
        self._series.degraded.set(0)

    def fell_back(self, op: str) -> None:
        self._series.fallbacks.labels(operation=op).inc()
