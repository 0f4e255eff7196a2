"""Starting a server process (the proxy, the simulator) on a free port, reliably.

Three things go wrong on a busy machine, and each is handled here:

- start-up is slow: under coverage's subprocess patch and a loaded CPU a proxy has taken
  more than 30 s to answer, so the wait is for readiness (the URL answering), with a
  deadline of minutes (``START_DEADLINE_S``) that only a hung process reaches;
- the port from ``free_port`` is only free when it is picked: the process may find it
  taken and exit with "address already in use" (then it is started again on a fresh
  port, as ``redis_start`` does for Redis), or another server on that port may answer
  the readiness check for it (so the answer counts only once the port's listening
  socket is seen to be this process's own, in /proc);
- a start that fails must say why: the process's output goes to a file (which cannot
  fill up and block it, as a pipe nobody reads can), and its tail is in the error.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

START_DEADLINE_S = 180.0
ATTEMPTS = 3
PORT_IN_USE = "address already in use"


class StartFailed(RuntimeError):
    """The process exited, or did not answer by the deadline; the message ends with the
    tail of its output."""

    def __init__(self, what: str, code: int | None, tail: str) -> None:
        how = f"exited while starting (exit {code})" if code is not None else "did not answer"
        super().__init__(f"{what} {how}; its output ends:\n{tail}")
        self.port_in_use = code is not None and PORT_IN_USE in tail.lower()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, size: int = 3000) -> str:
    """The last ``size`` bytes of the file at ``path``, as text."""
    with path.open("rb") as file:
        file.seek(max(path.stat().st_size - size, 0))
        return file.read().decode(errors="replace")


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on 127.0.0.1:``port`` (any process's)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
            inodes.add(inode)
    return inodes


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on ``port``. (A supervisor that
    forks workers holds the socket it binds for them.)"""
    inodes = _listening_inodes(port)
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def wait_ready(
    process: subprocess.Popen[bytes],
    port: int,
    path: str,
    log: Path,
    what: str,
    ready: Callable[[int], bool] = lambda status: status == 200,
    deadline_s: float = START_DEADLINE_S,
) -> None:
    """Until GET ``path`` on ``port`` answers a status ``ready`` accepts, from ``process``
    itself; StartFailed (with ``log``'s tail) as soon as it exits, or at the deadline."""
    url = f"http://127.0.0.1:{port}{path}"
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if ready(httpx.get(url, timeout=5).status_code) and listens_on(process.pid, port):
                return
        except httpx.TransportError:
            pass
        code = process.poll()
        if code is not None or time.monotonic() > deadline:
            raise StartFailed(what, code, tail(log))
        time.sleep(0.1)


def start_listening(
    argv: Callable[[int], list[str]],
    log: Path,
    path: str,
    what: str,
    env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
    ready: Callable[[int], bool] = lambda status: status == 200,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv(port)`` (its stdout and stderr to the file ``log``; its environment
    ``env``, or ``env(port)``) on a fresh free port and wait until it is ready
    (``wait_ready``); on a taken port, again on another, at most ATTEMPTS times. The
    process (the caller stops it) and its port."""
    for attempt in range(ATTEMPTS):
        port = free_port()
        with log.open("wb") as sink:
            environment = env(port) if callable(env) else env
            process = subprocess.Popen(argv(port), stdout=sink, stderr=sink, env=environment)
        try:
            wait_ready(process, port, path, log, what, ready)
        except BaseException as failure:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
            again = isinstance(failure, StartFailed) and failure.port_in_use
            if again and attempt < ATTEMPTS - 1:
                continue
            raise
        return process, port
    raise AssertionError("unreachable")  # the last attempt returns or raises
