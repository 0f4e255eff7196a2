"""Log output: JSON lines (or text) for the whole ``proxy`` logger tree, written off the loop.

``configure_logging`` is called once per process by ``__main__``. Every line
carries the request id of the request it was logged for (``REQUEST_ID``, a
context variable the request's record sets), so a compaction or an upstream
warning can be joined with its request's line. A log call may pass
``extra={"fields": {...}}``: JSON lines carry those as top-level keys, text
lines as ``key=value``.

Lines are written by one thread: a slow or blocked stderr (a log collector falling
behind) never stalls the event loop. A line logged through ``logging`` is formatted
where it is logged; a request's line (one a request, ``request_line_writer``) is handed
to that thread as the values it is made of, and formatted there with the others queued.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.util
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from proxy.observe.formats import ACCESS as ACCESS
from proxy.observe.formats import REQUEST_ID as REQUEST_ID
from proxy.observe.formats import JsonFormatter as JsonFormatter
from proxy.observe.formats import TextFormatter as TextFormatter

if TYPE_CHECKING:  # for annotations: configure_logging reads these settings
    from proxy.config import LoggingSettings

# Loggers whose level logging.level sets; every other library stays at warnings.
_OURS = ("proxy", "uvicorn")
# How often the writer thread writes what was logged since.
_FLUSH_S = 0.05


# A request's line as it is handed to the writer (``request_line_writer``): when it was
# logged, its request id, and what makes its fields (``build(values)``) from ``values``.
LineFields = Callable[[Any], dict[str, Any]]
_Later = tuple[float, str, LineFields, Any]
# Lines formatted and written in one go: the event loop waits for the thread at most
# that long (~0.3 ms) before the write hands the GIL back.
_CHUNK = 64


class _Writer:
    """The thread that writes log lines: every ``_FLUSH_S`` it writes whatever was queued,
    ``_CHUNK`` lines a call. Logging a line only appends it to a deque: no lock, no signal
    to this thread (a QueueListener is woken for every line, and each wake-up costs the
    event loop a hand-over of the GIL). A line reaches stderr at most ``_FLUSH_S`` late.

    A request's line comes as its values (``_Later``) and is formatted here, in order with
    the lines around it: the request path pays for gathering them only (bench/README.md,
    "the access line, third pass", has what that moved and what it saved). One whose
    fields cannot be made is written as an error line naming its request and counted
    (``unformatted``, and on the app's ``/metrics``: ``count_unformatted_with``): a line is
    never dropped, nor the thread stopped.

    A thread does not survive ``fork``: the thread stops before one (writing what is
    queued, so no thread crosses it: proxy.serve.workers forks its workers from a process
    without threads) and starts again after it, in the parent and in the child.
    """

    def __init__(self, stream: IO[str], lines: JsonFormatter | TextFormatter) -> None:
        self._queued: deque[str | _Later] = deque()
        self._stream = stream
        self._lines = lines
        self.unformatted = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def put(self, line: str | _Later) -> None:
        self._queued.append(line)  # atomic: safe from any thread

    def _run(self) -> None:
        stopping = False
        while not stopping:
            stopping = self._stopping.wait(_FLUSH_S)
            queued = self._queued
            left = len(queued)
            while left:
                batch = [queued.popleft() for _ in range(min(left, _CHUNK))]
                left -= len(batch)
                self._write(batch)

    def _write(self, batch: list[str | _Later]) -> None:
        text = [line if type(line) is str else self._formatted(line) for line in batch]  # type: ignore[arg-type]
        text.append("")  # the last line's newline: one join, no string a line
        try:
            self._stream.write("\n".join(text))
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed: there is nowhere left to say so
            pass

    def _formatted(self, line: _Later) -> str:
        created, request_id, build, values = line
        try:
            return self._lines.request_line(build(values), created)
        except Exception as exc:  # whatever it is, the line and the thread go on
            self.unformatted += 1
            record = logging.LogRecord(
                ACCESS.name,
                logging.ERROR,
                __file__,
                0,
                "request line not formatted: %s",
                (type(exc).__name__,),
                None,
            )
            record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
            record.fields = {"request_id": request_id}
            _count_unformatted_line()
            return self._lines.format(record)

    def stop(self) -> None:
        """Write what is queued, then end the thread."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join(timeout=5)
            self._thread = None


class _Enqueue(logging.Handler):
    """Formats where the line is logged (the request id is in that context) and queues it."""

    def __init__(self, writer: _Writer) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.put(self.format(record))
        except Exception:  # logging's own contract: a bad record must not break the caller
            self.handleError(record)


# One writer per process (logging itself is process-wide); configuring again replaces
# it, and exiting drains it. Request lines go to ``_direct`` straight while it is set.
_writer: _Writer | None = None
_direct: _Writer | None = None
# What else counts a request line not formatted: the app's counter (metrics/logs.py), the
# last one given; set before or after the writer, it outlives a configuring again.
_count_unformatted: Callable[[], object] | None = None


def count_unformatted_with(count: Callable[[], object] | None) -> None:
    """From now on ``count()`` is called (on the writer's thread) for each request line
    not formatted; one per process: the last one given. None: the writer's own count only."""
    global _count_unformatted
    _count_unformatted = count


def _count_unformatted_line() -> None:
    count = _count_unformatted
    if count is not None:
        # A metric's file that fails to grow: the error line and the thread still go on.
        with contextlib.suppress(Exception):
            count()


def _stop_writer() -> None:
    global _writer, _direct
    _direct = None
    if _writer is not None:
        _writer.stop()
        _writer = None


def configured() -> bool:
    """Whether ``configure_logging`` has run in this process: uvicorn then logs through it."""
    return _writer is not None


def request_line_writer() -> Callable[[str, LineFields, Any], None] | None:
    """What a request's line is written with, None when ``ACCESS`` writes no info lines:
    the recorder asks before it gathers one (and the level is checked once). Called with
    the request's id, ``build`` and ``values``, it writes the line of ``build(values)``'s
    fields as logged now: ``values`` must not change after (a tuple of immutable values),
    and ``build`` must be safe from another thread (it runs on the writer's)."""
    return _write_request_line if ACCESS.isEnabledFor(logging.INFO) else None


def _write_request_line(request_id: str, build: LineFields, values: Any) -> None:
    """Once ``configure_logging`` has run, the line's values are queued here for the writer
    to format: a LogRecord and the logging call around it cost more than the line itself
    (several times its CPU: bench/README.md), and there is one per request. Elsewhere
    (tests, an embedding application) it goes through ``ACCESS`` as any other line.
    """
    writer = _direct
    if writer is None:
        ACCESS.info("request", extra={"fields": build(values)})
        return
    writer.put((time.time(), request_id, build, values))


def _before_fork() -> None:
    if _writer is not None:
        _writer.stop()


def _after_fork() -> None:
    if _writer is not None:
        _writer.start()


def _finalize_in_worker(_: object) -> None:
    # A multiprocessing worker (proxy.serve.workers) ends through os._exit, which skips atexit;
    # its finalizers still run, and this one writes what is queued. (Registered once the
    # worker has started: multiprocessing clears the finalizers it forked with.)
    multiprocessing.util.Finalize(None, _stop_writer, exitpriority=0)


class _Hooks:
    registered = False  # os.register_at_fork has no way to unregister: once per process


def configure_logging(settings: LoggingSettings, stream: IO[str] | None = None) -> None:
    """Route every log line through ``settings.format`` to ``stream`` (stderr)."""
    global _writer, _direct
    _stop_writer()
    formatter = JsonFormatter() if settings.format == "json" else TextFormatter()
    _writer = _Writer(sys.stderr if stream is None else stream, formatter)
    atexit.unregister(_stop_writer)  # once, however often this runs
    atexit.register(_stop_writer)
    if not _Hooks.registered:
        os.register_at_fork(
            before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
        )
        multiprocessing.util.register_after_fork(_Hooks, _finalize_in_worker)
        _Hooks.registered = True
    handler = _Enqueue(_writer)
    handler.setFormatter(formatter)
    _direct = _writer
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in _OURS:
        logging.getLogger(name).setLevel(settings.level.upper())
