"""Several worker processes on one port: ``run_workers(settings)`` (``server.workers`` > 1).

The supervisor binds the listening socket once and forks ``server.workers``
workers that all accept on it; each runs the app under ``GracefulServer``, as a
single process does. The supervisor:

- gives the workers one fresh metrics directory (prometheus-client's
  multiprocess mode), so ``/metrics`` from any worker is the sum over all, and
  removes it on exit; it marks each worker that exits as dead there (gauges of
  the ``live*`` modes then drop its values);
- starts a replacement for a worker that dies while serving (counted in
  ``compaction_proxy_worker_restarts_total``, in the same files), and stops
  everything if a worker fails to start (uvicorn's exit status 3, which the
  supervisor exits with too: the app's start-up failed, and would again);
- passes SIGHUP on to every worker, which re-reads the config file's tenants policy
  (proxy.serve.reload; each also watches the file itself);
- on SIGTERM or SIGINT closes its copy of the socket and sends SIGTERM to every
  worker, which drain as proxy.serve.shutdown describes (the socket closes, refusing
  connections, once the last worker stops accepting); it waits for them for
  ``drain_delay_s + shutdown_timeout_s`` and a margin, kills any left, and exits
  0 if every worker stopped cleanly.

Workers are forked rather than spawned: the supervisor has no threads and no
event loop when it forks, and a forked worker keeps the settings and the
logging set up by the command line without re-reading or pickling anything.
A worker whose supervisor disappears (SIGKILL) drains and exits by itself.
Each worker's ``memory://`` store is its own: sessions and learned windows are
shared between workers only through Redis.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.multiprocess import mark_process_dead

from proxy.config import Settings
from proxy.observe.metrics import enable_multiprocess
from proxy.observe.metrics.process import worker_restarts

log = logging.getLogger("proxy.workers")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STARTUP_FAILURE = 3  # uvicorn's exit status when the app's lifespan fails to start
# Beyond drain_delay_s + shutdown_timeout_s: cutting requests, closing the store and client.
_STOP_MARGIN_S = 10.0
# A worker killed by the stop signal before it could handle it had nothing in flight.
_CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)


def run_workers(settings: Settings) -> int:
    """Serve with ``settings.server.workers`` processes until SIGTERM; the exit status."""
    server = settings.server
    if settings.store.url.startswith("memory://"):
        log.warning(
            "store.url is memory://: each of the %d workers keeps its own sessions and "
            "learned windows (a turn served by another worker starts without them); "
            "use Redis to share them",
            server.workers,
        )
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    listener = socket.create_server((server.host, server.port), family=family, backlog=2048)
    directory = tempfile.mkdtemp(prefix="compaction-proxy-metrics-")
    try:
        port = listener.getsockname()[1]
        log.info("listening on %s:%d with %d workers", server.host, port, server.workers)
        return _Supervisor(settings, listener, directory).run()
    finally:
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)


class _Supervisor:
    def __init__(self, settings: Settings, listener: socket.socket, directory: str) -> None:
        self.settings = settings
        self.listener = listener
        self.directory = directory
        self.workers: list[BaseProcess] = []
        self.stopping = False
        self.restarts: Counter | None = None  # made at the first restart
        self._fork = multiprocessing.get_context("fork")

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _SIGNALS}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        try:
            self.workers = [self._start() for _ in range(self.settings.server.workers)]
            healthy = True
            while not self.stopping and healthy:
                ready = wait([wake_read, *(w.sentinel for w in self.workers)])
                if wake_read in ready:
                    os.read(wake_read, 512)
                healthy = self.stopping or self._replace_exited()
            status = self._stop_all()
            # A worker that cannot start: exit as one process would (uvicorn's status 3).
            return status if healthy else _STARTUP_FAILURE
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping:  # a second signal: pass it on (a second Ctrl-C stops waiting)
            for worker in self.workers:
                if worker.pid is not None and worker.exitcode is None:
                    os.kill(worker.pid, sig)
        self.stopping = True

    def _on_hangup(self, sig: int, frame: FrameType | None) -> None:
        # Every worker re-reads the config file's tenants policy (serve/reload.py).
        for worker in self.workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGHUP)

    def _start(self) -> BaseProcess:
        args = (self.settings, self.listener, self.directory, os.getpid())
        worker = self._fork.Process(target=_work, args=args, name="compaction-proxy-worker")
        worker.start()
        return worker

    def _replace_exited(self) -> bool:
        """Replace workers that died; False if one failed to start (stop everything)."""
        for i, worker in enumerate(self.workers):
            if worker.exitcode is None:
                continue
            worker.join()
            self._mark_dead(worker)
            if worker.exitcode == _STARTUP_FAILURE:
                log.error("worker %d failed to start: stopping", worker.pid)
                return False
            log.error("worker %d exited (status %s): starting another", worker.pid, worker.exitcode)
            self._count_restart()
            self.workers[i] = self._start()
        return True

    def _count_restart(self) -> None:
        # In the workers' metrics directory, which /metrics sums (their zeros included).
        if self.restarts is None:
            enable_multiprocess(self.directory)
            self.restarts = worker_restarts(CollectorRegistry())
        self.restarts.inc()

    def _stop_all(self) -> int:
        # Once every worker has stopped accepting, the socket closes and connections are refused.
        self.listener.close()
        for worker in self.workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGTERM)
        server = self.settings.server
        deadline = time.monotonic() + server.drain_delay_s + server.shutdown_timeout_s
        deadline += _STOP_MARGIN_S
        status = 0
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.exitcode is None:
                log.error("worker %d did not stop in time: killed", worker.pid)
                worker.kill()
                worker.join()
            if worker.exitcode not in _CLEAN_EXITS:
                status = 1
            self._mark_dead(worker)
        return status

    def _mark_dead(self, worker: BaseProcess) -> None:
        # Its live gauges leave /metrics; its counters stay in the sums.
        mark_process_dead(worker.pid, self.directory)  # type: ignore[no-untyped-call]  # untyped


def _work(settings: Settings, listener: socket.socket, directory: str, parent_pid: int) -> None:
    """A worker's whole life, in the forked process."""
    for sig in _SIGNALS:  # the supervisor's handlers were inherited; the server installs its own
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until its app watches for it (reload.py)
    enable_multiprocess(directory)
    from proxy.serve.server import serve_process

    serve_process(settings, sockets=[listener], parent_pid=parent_pid)
