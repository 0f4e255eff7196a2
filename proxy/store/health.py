"""A shared store's health as one replica sees it from its own calls: ``Health``, the
value ``/readyz`` reports, and ``StoreWatch``, which keeps it, counts and logs.

A store is failing from a failed call until a write it *performed* shows it takes
writes again: a compare-and-swap that wrote, a ``SET`` that stored, a lock taken, the
readiness probe's own write. A read-only replica or a full Redis (``maxmemory`` with
``noeviction``) answers reads and PINGs, and runs a script that ends before its write
(a compare-and-swap that lost) or a ``DEL`` (which frees memory): none of those proves
that snapshots are shared again. And a performed write ends the failure only once no
call has failed for ``SETTLE_S``: a Redis at its memory limit takes a write now and
then, and readiness must not flap with it. On a cluster a write reaches one primary,
so only the probe, which writes to every primary, ends a failure, and it names how
many refused (``degraded (oom, 1/3 primaries)``).

A store that did not answer (no connection, a timeout, bad credentials; anything
unrecognised) is left alone for a short cool-down, jittered so that replicas which met
the same outage do not all reconnect at once, and no request waits on a dead server
more than once per cool-down; one that answered with a refusal (MOVED, READONLY,
OOM...) costs a round trip, so every call still tries it, and each failure is counted.
Each cause is logged when first met and then at most once per interval; "shared again"
once, when the failure ends.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.errors import StoreError
from proxy.observe.metrics.store import StoreSeries

log = logging.getLogger("proxy.store")

# The longest cool-down; each one is drawn between half of it and all of it.
COOLDOWN_S = 2.0
COOLDOWN_JITTER = 0.5
LOG_INTERVAL_S = 30.0
# /readyz writes a probe when no write (nor any failure) was seen for this long.
PROBE_AFTER_S = 2.0
# A failure ends with a write performed at least this long after the last failure; while
# failing, /readyz probes at most this often.
SETTLE_S = 1.0
# Kinds where the store answered at once (a wrong node, a replica, a full or refusing
# server): trying it costs a round trip, not a timeout, so every call still tries it.
ANSWERED = frozenset({"moved", "readonly", "oom", "crossslot", "noperm"})
# Kinds where the store did not answer this replica at all.
UNREACHABLE = frozenset({"timeout", "connection", "auth"})


def jittered_cooldown() -> float:
    """A cool-down: ``COOLDOWN_S`` less up to ``COOLDOWN_JITTER`` of it, at random."""
    return COOLDOWN_S * (1.0 - COOLDOWN_JITTER * random.random())


class ProbeFailed(StoreError):
    """The probe of a cluster refused by some of its primaries (``failing``, their
    ``host:port``) of ``primaries``; raised from the first one's error."""

    def __init__(self, message: str, failing: Sequence[str], primaries: int) -> None:
        super().__init__(message)
        self.failing = tuple(failing)
        self.primaries = primaries


@dataclass(frozen=True, slots=True)
class Health:
    """What a store's recent calls say of it: ok (``cause`` None), or the kind of the
    last failure they met (``observe.metrics.series.STORE_FAILURE_KINDS``); on a cluster, how
    many of its ``primaries`` the last probe found ``failing`` (0 of 0: not probed)."""

    cause: str | None = None
    failing: int = 0
    primaries: int = 0

    @property
    def ok(self) -> bool:
        return self.cause is None

    def __str__(self) -> str:
        """``ok``, ``degraded (readonly)``, ``unreachable (connection)``,
        ``degraded (oom, 1/3 primaries)``..."""
        if self.cause is None:
            return "ok"
        state = "unreachable" if self.cause in UNREACHABLE else "degraded"
        where = f", {self.failing}/{self.primaries} primaries" if self.primaries else ""
        return f"{state} ({self.cause}{where})"


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
    """The shared store's health from this replica's calls: ``failed`` after each that
    failed, ``wrote`` after each write the store performed, ``fell_back`` for each call
    served from local state instead. Reads that succeed tell it nothing.

    ``one_server``: any write performed reaches the whole store. Otherwise (a cluster)
    an ordinary write reaches one primary, and only ``wrote("probe")`` ends a failure;
    ``probe_due`` says when one is worth making."""

    def __init__(
        self,
        series: StoreSeries,
        clock: Callable[[], float],
        *,
        one_server: bool = True,
        cooldown: Callable[[], float] = jittered_cooldown,
    ) -> None:
        self._series = series
        self._clock = clock
        self._one_server = one_server
        self._cooldown = cooldown
        self.cause: str | None = None
        self._spread = (0, 0)  # primaries the last failed probe found failing, of how many
        self._cooling_until = 0.0
        self._failed_at = -SETTLE_S - PROBE_AFTER_S
        self._wrote_at = -PROBE_AFTER_S  # a write that reached the whole store
        self._probed_at = -PROBE_AFTER_S
        self._reports = Reports(clock)  # by cause
        series.degraded.set(0)

    @property
    def cooling(self) -> bool:
        """In the cool-down after a failure of a store that did not answer: don't try it."""
        return self._clock() < self._cooling_until

    @property
    def health(self) -> Health:
        if self.cause is None:
            return Health()
        return Health(self.cause, *self._spread)

    @property
    def probe_due(self) -> bool:
        """Whether a probe would tell more than the calls seen: while failing, at most one
        per ``SETTLE_S`` (it may end the failure, and names the primaries that refuse);
        else when no write nor failure was seen for ``PROBE_AFTER_S``."""
        now = self._clock()
        if self.cause is not None:
            return now - self._probed_at >= SETTLE_S
        return now - max(self._failed_at, self._wrote_at, self._probed_at) >= PROBE_AFTER_S

    @property
    def may_recover(self) -> bool:
        """Failing, yet no call failed and no probe was made for ``SETTLE_S``: a probe
        that succeeds now ends the failure."""
        now = self._clock()
        settled = now - max(self._failed_at, self._probed_at) >= SETTLE_S
        return self.cause is not None and settled

    def probing(self) -> None:
        """A probe is being made (``probe_due`` counts from its start)."""
        self._probed_at = self._clock()

    def failed(self, op: str, kind: str, exc: BaseException) -> None:
        now = self._clock()
        self._series.errors.labels(operation=op).inc()
        self._series.failures.labels(kind=kind).inc()
        self._series.degraded.set(1)
        where = ""
        if isinstance(exc, ProbeFailed):
            self._spread = (len(exc.failing), exc.primaries)
            where = f" on {', '.join(exc.failing)}"
        elif kind != self.cause:
            # The last probe counted the primaries failing with its own cause, not this.
            self._spread = (0, 0)
        self.cause = kind
        self._failed_at = now
        if kind not in ANSWERED:
            self._cooling_until = now + self._cooldown()
        # Which primaries a probe found failing is reported apart: the call that first
        # met the cause could not say.
        extra = self._reports.due(kind + where)
        if extra is None:
            return
        log.warning(
            "store unavailable (%s: %s failed%s: %s); serving from local state until its "
            "writes succeed again%s",
            kind,
            op,
            where,
            exc,
            extra,
        )

    def wrote(self, op: str) -> None:
        """A write the store performed (not one that ended without writing). It ends a
        failure if it reached the whole store (one server's, or the probe) and no call
        failed for ``SETTLE_S``."""
        now = self._clock()
        if op != "probe" and not self._one_server:
            return
        self._wrote_at = now
        # A probe taken before the failure settled leaves the last count standing:
        # /readyz still names how many primaries the fault reached.
        if self.cause is None or now - self._failed_at < SETTLE_S:
            return
        log.warning(
            "store reachable again (%s succeeded after %s); snapshots are shared across "
            "replicas once more",
            op,
            self.cause,
        )
        self.cause = None
        self._spread = (0, 0)
        self._cooling_until = 0.0
        self._reports.clear()
        self._series.degraded.set(0)

    def fell_back(self, op: str) -> None:
        self._series.fallbacks.labels(operation=op).inc()
