"""Issue 23 item 7: SIGTERM is honoured from the first instant with the proxy as PID 1.

In a container the entry point is PID 1, and the kernel drops a signal PID 1 has no
handler for: a SIGTERM that arrives while ``compaction-proxy serve`` is still starting
(imports, the config, tokenizers) would be lost, and the orchestrator would wait out its
grace period to SIGKILL. The proxy runs here as PID 1 of a PID namespace of its own
(``unshare``, as root), held at the very start: its config file is a FIFO nobody writes
to yet, so it blocks reading it, before any server exists.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace needs root and unshare (util-linux)",
)


# What /proc/PID/wchan says of a process blocked opening a FIFO, by kernel version.
_FIFO_WAITS = ("wait_for_partner", "fifo_open")


def _child(pid: int) -> int | None:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = children.read_text().split() if children.exists() else []
    return int(found[0]) if found else None


def _opening_a_fifo(pid: int | None) -> bool:
    """Whether ``pid`` is blocked opening a FIFO (waiting for a writer)."""
    wchan = Path(f"/proc/{pid}/wchan")
    return pid is not None and wchan.exists() and wchan.read_text() in _FIFO_WAITS


def test_sigterm_during_start_up_ends_the_proxy_as_pid_1(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    os.mkfifo(config)
    command = [sys.executable, "-m", "proxy", "serve", "--config", str(config)]
    unshare = ["unshare", "--pid", "--fork", "--kill-child"]
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen([*unshare, *command], stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 30
        pid = None
        while not _opening_a_fifo(pid):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the proxy never reached its config file"
            time.sleep(0.01)
            pid = pid or _child(process.pid)
        os.kill(pid, signal.SIGTERM)  # still starting: no server, no uvicorn handler yet
        try:
            assert process.wait(timeout=10) == 128 + signal.SIGTERM
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM was ignored: the proxy, PID 1, is still starting")
    finally:
        if process.poll() is None:
            process.kill()  # --kill-child: the proxy goes with it
            process.wait(timeout=10)
