"""Stopping one serving process gracefully: ``GracefulServer`` and its ``Drain``.

On SIGTERM (or SIGINT):

1. ``/readyz`` answers 503 at once (``Drain.draining``), while the process keeps
   accepting and serving for ``server.drain_delay_s``: time for a load balancer
   (Kubernetes endpoints) to stop routing here before connections are refused.
   A second signal cuts the delay short.
2. It stops accepting (the listening socket closes: new connections are refused),
   closes idle keep-alive connections and lets requests in flight, streams
   included, finish for at most ``server.shutdown_timeout_s``.
3. Requests still running then are ended: their connections closed and their
   tasks cancelled (which closes their upstream calls), with one warning and
   ``compaction_proxy_requests_cut_at_shutdown_total``.
4. The app's lifespan closes the store and the upstream client; the process exits 0.

uvicorn's own ``Server`` does 2 and 4 but ends 3 with a traceback per request,
has no drain delay, and re-raises the signal once done, so a clean drain
would still exit 143. This subclass replaces its signal handling and its
``shutdown``; it relies on uvicorn's ``servers``, ``server_state`` (connections
and tasks), ``lifespan`` and ``force_exit``, public attributes it has kept for
many releases.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from socket import socket
from types import FrameType

import uvicorn

from proxy.config import ServerSettings
from proxy.observe.metrics import Metrics

log = logging.getLogger("proxy.shutdown")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# After the deadline, how long cancelled requests get to run their clean-up (closing
# their upstream responses) before the upstream client itself is closed.
_CUT_GRACE_S = 2.0
# A worker looks for its parent every this many ticks (uvicorn ticks every 0.1 s).
_PARENT_CHECK_TICKS = 10


class Drain:
    """Shared by a server and its app: whether the process is stopping (``/readyz``
    fails from then on), and the app's metrics, once its lifespan has built them."""

    def __init__(self) -> None:
        self.draining = False
        self.metrics: Metrics | None = None


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the shutdown sequence above.

    ``parent_pid``: for a worker process, its supervisor's pid; if the supervisor
    disappears, the worker drains and exits as on SIGTERM rather than live on orphaned.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        limits: ServerSettings,
        parent_pid: int | None = None,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_delay_s = limits.drain_delay_s
        self.shutdown_timeout_s = limits.shutdown_timeout_s
        self.parent_pid = parent_pid
        self._stop_accepting_at: float | None = None
        self._announced = False

    async def startup(self, sockets: list[socket] | None = None) -> None:
        await super().startup(sockets)
        # What start-up built (tokenizer tables, the model table, the app) lives as long
        # as the process: out of the collector's sight, a full collection under load
        # stops the loop a tenth as long (at saturation; bench/README.md).
        gc.collect()
        gc.freeze()

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        # As uvicorn's, without raising the signal again afterwards: a drained
        # process exits 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            # Already stopping: a second Ctrl-C stops waiting for requests, as in uvicorn.
            self.force_exit = self.force_exit or sig == signal.SIGINT
        elif self._stop_accepting_at is None and self.drain_delay_s > 0:
            self.begin_drain()
        else:
            self.drain.draining = True
            self.should_exit = True

    def begin_drain(self) -> None:
        """Fail readiness now; stop accepting once the drain delay has passed."""
        self.drain.draining = True
        self._stop_accepting_at = time.monotonic() + self.drain_delay_s

    async def on_tick(self, counter: int) -> bool:
        # Logged here rather than in the signal handler, which may interrupt a log call.
        if self.drain.draining and not self._announced and not self.should_exit:
            self._announced = True
            log.info(
                "stopping: /readyz now answers 503; new connections accepted for %.1f s more",
                self.drain_delay_s,
            )
        if self._stop_accepting_at is not None and time.monotonic() >= self._stop_accepting_at:
            self.should_exit = True
        elif (
            self.parent_pid is not None
            and counter % _PARENT_CHECK_TICKS == 0
            and os.getppid() != self.parent_pid
            and not self.drain.draining
        ):
            log.warning("the supervisor process is gone: this worker stops")
            self.drain.draining = True
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket] | None = None) -> None:
        self.drain.draining = True
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        connections = list(self.server_state.connections)
        # Idle keep-alive connections close now; busy ones after their response.
        for connection in connections:
            connection.shutdown()
        busy = len(self.server_state.tasks)
        if busy:
            log.info(
                "stopped accepting; waiting up to %.1f s for %d request(s) in flight",
                self.shutdown_timeout_s,
                busy,
            )
        try:
            await asyncio.wait_for(self._finished(), timeout=self.shutdown_timeout_s)
        except TimeoutError:
            await self._cut()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _finished(self) -> None:
        # uvicorn's connection and task sets signal nothing when they empty: polled, as it does.
        while (  # noqa: ASYNC110
            self.server_state.connections or self.server_state.tasks
        ) and not self.force_exit:
            await asyncio.sleep(0.1)
        for server in self.servers:
            await server.wait_closed()

    async def _cut(self) -> None:
        tasks = list(self.server_state.tasks)
        log.warning(
            "shutdown_timeout_s (%.1f s) reached: ending %d request(s) still running, "
            "streams included",
            self.shutdown_timeout_s,
            len(tasks),
        )
        if self.drain.metrics is not None:
            self.drain.metrics.requests_cut_at_shutdown.inc(len(tasks))
        # uvicorn logs each cancelled request as an ASGI error with a traceback;
        # these were cancelled on purpose and counted above.
        logging.getLogger("uvicorn.error").addFilter(_not_cancelled)
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.close()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CUT_GRACE_S)


def _not_cancelled(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))
