"""Reloading the tenants policy without a restart (README "Per-tenant policy").

Each serving process (every worker) re-reads the config file it started from when the
file changes (its size, modification time or inode, checked every
``server.reload_poll_s``) and on SIGHUP (a supervisor passes it on to its workers:
workers.py). The whole file is validated as at start-up, environment overrides
included; only ``tenants`` is applied, resolved over the ``compaction`` the process
started with (any other change waits for a restart, and is said so). A file that does
not validate keeps the policy in force, and the log says why, naming keys, never
values. So does a file that sets no ``tenants`` at all (neither the file nor the
environment) while entries are in force: editors and ``> file`` truncate before they
write, and a poll that catches the empty (or comment-only) file must not read it as
"no entries"; ``tenants: []`` says that. A file is read only once it has settled: the
same (stamp and content) across a pause of ``SETTLE_S``, so a writer caught mid-file
(a cut that is still valid YAML, ending after one entry of three) does not apply a
subset; a file that keeps changing is retried at the next poll. Each re-read is
counted: ``config_reloads_total{outcome}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

import yaml

from proxy.config import Settings, load_settings
from proxy.errors import ConfigError
from proxy.services import Services
from proxy.tenants import PolicyTable

log = logging.getLogger("proxy.reload")

Stamp = tuple[int, int, int] | None  # inode, size, modification time (ns); None: unreadable


def _stamp(path: Path) -> Stamp:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


SETTLE_S = 0.1  # a file unchanged this long is taken as written whole
SETTLE_TRIES = 5  # then the next poll (or SIGHUP) tries again
Version = tuple[Stamp, bytes]  # the stamp and a digest of the content


def _version(path: Path) -> Version:
    try:
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").digest()
    except OSError:
        digest = b""
    return (_stamp(path), digest)


def _pause(seconds: float) -> None:
    time.sleep(seconds)  # in a worker thread (asyncio.to_thread): never on the loop


def _load_settled(path: Path) -> tuple[Settings, Version] | None:
    """The settings of ``path`` once it has settled, and the version they were read
    from; None if it was still changing after ``SETTLE_TRIES`` pauses."""
    before = _version(path)
    for _ in range(SETTLE_TRIES):
        _pause(SETTLE_S)
        now = _version(path)
        if now == before:
            settings = load_settings(path)
            if _version(path) == now:  # not rewritten while it was read
                return settings, now
            now = _version(path)
        before = now
    return None


class Reloader:
    """The config file's watcher for one process's ``services``."""

    def __init__(self, services: Services, path: Path) -> None:
        self.services = services
        self.path = path
        self.stamp = _stamp(path)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._signal = False
        self._refused: Version | None = None  # the file version last refused for no tenants

    def start(self) -> None:
        """Watch from now on: SIGHUP (from the main thread only) and, unless
        ``reload_poll_s`` is 0, the file's stamp."""
        if threading.current_thread() is threading.main_thread():
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._wake.set)
            self._signal = True
        self._task = asyncio.create_task(self._watch())

    async def aclose(self) -> None:
        if self._signal:  # ignored from now on: SIGHUP's default would end the process
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        every = self.services.settings.server.reload_poll_s
        # A worker started after the file changed (a replacement) has its supervisor's
        # settings, read before: it catches up at once (not counted when unchanged).
        await self.reload("start")
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), every or None)
            hup = self._wake.is_set()
            self._wake.clear()
            stamp = await asyncio.to_thread(_stamp, self.path)
            if hup or stamp != self.stamp:
                self.stamp = stamp
                await self.reload("SIGHUP" if hup else "file change")

    async def reload(self, why: str) -> str:
        """Re-read the file; the outcome counted (applied, unchanged, invalid)."""
        running = self.services.settings
        try:
            settled = await asyncio.to_thread(_load_settled, self.path)
            if settled is None:
                return self._count("invalid", why, "the file is still changing (mid-write?)")
            fresh, version = settled
            table = PolicyTable.build(fresh.tenants, running.compaction)
        except ConfigError as exc:
            return self._count("invalid", why, _safe(exc))
        except ValueError as exc:  # valid alone, not over the compaction in force
            return self._count("invalid", why, str(exc))
        except Exception as exc:  # e.g. RecursionError from YAML nested 3,000 deep: a file
            # that breaks the reader must not end the watch (the next good file applies)
            return self._count("invalid", why, f"unreadable ({type(exc).__name__})")
        policies = self.services.policies
        if "tenants" not in fresh.model_fields_set and policies.table.entries:
            # Said once per version of the file: a SIGHUP, or a file that stays so, is
            # still counted, but the log does not repeat the same advice.
            detail = (
                "the file sets no tenants (empty, or caught mid-write?); to clear the "
                "entries in force write `tenants: []` (a restart also applies the file as is)"
            )
            quiet, self._refused = version == self._refused, version
            return self._count("invalid", why, detail, quiet=quiet)
        if table.entries == policies.table.entries:
            return self._count("unchanged", why)
        policies.table = table
        if _others(fresh) != _others(running):
            log.warning("config reload (%s): only tenants applied; restart for the rest", why)
        return self._count("applied", why, f"{len(table.entries)} tenants entries")

    def _count(self, outcome: str, why: str, detail: str = "", quiet: bool = False) -> str:
        if why == "start" and outcome == "unchanged":
            return outcome
        self.services.metrics.tenants.reloads.labels(outcome=outcome).inc()
        if quiet:
            pass
        elif outcome == "invalid":
            log.warning("config reload (%s) rejected, tenants policy kept: %s", why, detail)
        else:
            log.info("config reload (%s) in process %d: %s %s", why, os.getpid(), outcome, detail)
        return outcome


def _others(settings: Settings) -> dict[str, object]:
    # --host and --port override the file's: not a change.
    return settings.model_dump(exclude={"tenants": True, "server": {"host", "port"}})


def _safe(exc: ConfigError) -> str:
    """What to log of ``exc``: a YAML error by its place alone (PyYAML's message quotes
    the line, which may hold a secret); validation errors name keys, not values."""
    cause = exc.__cause__
    if isinstance(cause, yaml.MarkedYAMLError) and cause.problem_mark is not None:
        mark = cause.problem_mark
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}"
    return exc.message.split(" is not valid YAML")[0]
