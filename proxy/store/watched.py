"""The remote store's calls as ``ResilientStore`` makes them: each timed (failures
included) and told to the ``StoreWatch``, served from the local store when the remote
fails or is in its cool-down; and the probe that ``/readyz`` and a recovering store
write (``health.py`` says what ends a failure).

A write ends a failure only if the store performed it: each call names how its result
says so (``written``: a save's True, an acquire's token; ``always_written``: a ``SET``,
which returns only once done). While failing, a call the store answered starts a probe
in the background, at most one per ``SETTLE_S``: a read, a write that wrote nothing, or
one primary's write does not show that it takes writes again, and the failure must end
without ``/readyz`` polling too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.observe.metrics.series import STORE_OPERATIONS
from proxy.store.failures import failure_kind
from proxy.store.health import Health, StoreWatch
from proxy.store.memory import MemoryStore
from proxy.store.protocols import Remote

T = TypeVar("T")
log = logging.getLogger("proxy.store")


def written(result: object) -> bool:
    """A save's True, an acquire's token: the store performed the write."""
    return bool(result)


def always_written(_: object) -> bool:
    """A call that returns only once the store performed its write (a ``SET``)."""
    return True


class WatchedRemote:
    """``remote``'s calls, watched, with ``local`` to serve them when it fails."""

    def __init__(
        self, remote: Remote, local: MemoryStore, metrics: Metrics, clock: Callable[[], float]
    ) -> None:
        self.remote = remote
        self.local = local
        self._latency = {op: metrics.store_duration.labels(operation=op) for op in STORE_OPERATIONS}
        self._watch = StoreWatch(metrics.store, clock, one_server=remote.one_server)
        self._prober: asyncio.Task[None] | None = None  # a background probe

    @property
    def degraded(self) -> bool:
        """In the cool-down after a failure: calls are served locally, the store untried."""
        return self._watch.cooling

    @property
    def one_server(self) -> bool:
        return self.remote.one_server

    async def _call(
        self,
        op: str,
        remote: Callable[[], Awaitable[T]],
        local: Callable[[], Awaitable[T]],
        wrote: Callable[[T], bool] | None = None,
    ) -> T:
        if not self.degraded:
            with contextlib.suppress(StoreError):
                return await self._tried(op, remote(), wrote)
        self._watch.fell_back(op)
        return await local()

    async def _read(
        self, op: str, remote: Callable[[], Awaitable[T]], local: Callable[[], Awaitable[T]]
    ) -> T:
        """``_call``; while the store fails, the local value where the store has none (it
        refused the write that would have put it there)."""
        found = await self._call(op, remote, local)
        if found is None and self._watch.cause is not None:
            return await local()
        return found

    async def _tried(
        self, op: str, call: Awaitable[T], wrote: Callable[[T], bool] | None = None
    ) -> T:
        """A remote call, timed and told to the watch: a failure, or a write the store
        performed (``wrote`` of the result; None: not a write that shows it, such as a
        delete, which a full Redis still runs); ``StoreError`` raised on."""
        started = time.perf_counter()
        try:
            result = await call
        except StoreError as exc:
            self._watch.failed(op, failure_kind(exc), exc)
            raise
        finally:
            self._latency[op].observe(time.perf_counter() - started)
        if wrote is not None and wrote(result):
            self._watch.wrote(op)
        if self._watch.may_recover:
            self._probe_soon()
        return result

    def _probe_soon(self) -> None:
        # The task is held here until done (and the next replaces it only then).
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_quietly())

    async def _probe_quietly(self) -> None:
        """The background probe: nobody awaits its task, so what it raises ends here."""
        try:
            await self.probe()
        except StoreError:
            pass  # counted and logged by the watch
        except Exception:
            # Not the store's answer (a bug): said, not left in a task no one reads.
            log.exception("store probe raised unexpectedly")

    async def ping(self) -> bool:
        return await self.remote.ping()

    async def probe(self) -> None:
        """A write of the probe key (a cluster's: one on every primary), counted like any
        call (``StoreError`` if refused)."""
        self._watch.probing()
        await self._tried("probe", self.remote.probe(), always_written)

    async def health(self) -> Health:
        """The store's state as recent calls left it; a probe's first when it would tell
        more (``StoreWatch.probe_due``: with no write nor failure seen for
        ``PROBE_AFTER_S``, or at most once per ``SETTLE_S`` while failing)."""
        if self._watch.probe_due:
            with contextlib.suppress(StoreError):
                await self.probe()
        return self._watch.health

    async def _stop_probing(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
