"""Starting redis-server (or valkey-server, or a sentinel) for a test, reliably.

A port from ``free_port`` is only free when it is picked: before redis-server binds it,
the port may be taken (the source port of one of the test process's outbound
connections, in the same range, or another server's), and redis-server exits at once
with "Address already in use". So each server's output is kept (``LoggedProcess``), its
exit is noticed while waiting for it (``wait_serving``: the error ends with its log's
tail), and a start that failed on a taken port is tried again with fresh ports, a few
times (``with_fresh_ports``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

PORT_IN_USE = "Address already in use"
ATTEMPTS = 3


class StartFailed(RuntimeError):
    """A server exited while starting; the message ends with the tail of its output."""

    def __init__(self, what: str, code: int | None, tail: str) -> None:
        super().__init__(f"{what} exited while starting (exit {code}):\n{tail}")
        self.port_in_use = PORT_IN_USE in tail


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now: each bound until all are picked, so
    the kernel cannot hand out one number twice (a closed port is free to pick again)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class LoggedProcess(subprocess.Popen[bytes]):
    """A server process whose output (stdout and stderr) goes to an unnamed temporary
    file, read back by ``tail`` once it has exited."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        try:
            super().__init__(list(argv), stdout=self.log, stderr=subprocess.STDOUT)
        except BaseException:
            self.log.close()
            raise

    def tail(self, size: int = 1200) -> str:
        """The last ``size`` bytes of its output (read without moving the offset the
        process writes at: the file is shared with it)."""
        fd = self.log.fileno()
        end = os.fstat(fd).st_size
        return os.pread(fd, size, max(end - size, 0)).decode(errors="replace")

    def stop(self) -> None:
        """Killed (by PID) if still running, reaped, its log closed."""
        if self.poll() is None:
            self.kill()
        self.wait(timeout=10)
        self.log.close()

    def check_running(self, what: str) -> None:
        """StartFailed, with its output's tail, if it has exited."""
        code = self.poll()
        if code is not None:
            raise StartFailed(what, code, self.tail())


def wait_serving(process: LoggedProcess, client: Any, deadline: float, what: str) -> None:
    """Until the server answers ``client`` (then closed) as this very process (its INFO's
    ``process_id``: not another server on a port it failed to bind); StartFailed at once
    if it exits, RuntimeError at ``deadline``."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client.set_retry(Retry(NoBackoff(), 0))  # each try briefly, checking on the process between
    try:
        while True:
            process.check_running(what)
            try:
                if int(client.info("server")["process_id"]) == process.pid:
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                process.check_running(what)
                raise RuntimeError(f"{what} did not answer in time; its output:\n{process.tail()}")
            time.sleep(0.05)
    finally:
        client.close()


def with_fresh_ports(attempt: Callable[[int], None], stop: Callable[[], None]) -> None:
    """``attempt(n)`` (n from 0: it picks fresh ports when n > 0) until it does not fail on
    a taken port, at most ATTEMPTS times; ``stop`` (kill what it started) after each
    failure. Any other failure, or the last one, is raised."""
    for n in range(ATTEMPTS):
        try:
            attempt(n)
            return
        except StartFailed as failure:
            stop()
            if not failure.port_in_use or n == ATTEMPTS - 1:
                raise
        except BaseException:
            stop()
            raise
