"""Log output: JSON lines (or text) for the whole ``proxy`` logger tree, written off the loop.

``configure_logging`` is called once per process by ``__main__``. Every line
carries the request id of the request it was logged for (``REQUEST_ID``, a
context variable the request's record sets), so a compaction or an upstream
warning can be joined with its request's line. A log call may pass
``extra={"fields": {...}}``: JSON lines carry those as top-level keys, text
lines as ``key=value``.

Lines are formatted where they are logged and written by one thread: a slow or
blocked stderr (a log collector falling behind) never stalls the event loop.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import IO, TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # for annotations: configure_logging reads these settings
    from proxy.config import LoggingSettings

# Each request's line (proxy/observe/record.py); its level decides whether they are written.
ACCESS = logging.getLogger("proxy.access")
_REQUEST_HEAD = {"level": "info", "logger": ACCESS.name, "msg": "request"}
_REQUEST_HEAD_KEYS = frozenset(("ts", *_REQUEST_HEAD))
_REQUEST_HEAD_BYTES = b'",' + orjson.dumps(_REQUEST_HEAD)[1:-1] + b","
# The id of the request being served, for every line logged while serving it.
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Loggers whose level logging.level sets; every other library stays at warnings.
_OURS = ("proxy", "uvicorn")
# Bytes a text value may hold unquoted: anything else (spaces, quotes, newlines a
# client put in a path) is written JSON-quoted, so one line stays one line.
# How often the writer thread writes what was logged since.
_FLUSH_S = 0.05
# A timestamp's tail, by its millisecond: ".000Z" to ".999Z" (one formatting fewer a
# line), and ".1000Z" as the formatting wrote a fraction that rounds up to 1000.
_MILLISECONDS = tuple(f".{ms:03d}Z" for ms in range(1001))
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._:/+@")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, then the fields."""

    def __init__(self) -> None:
        super().__init__()
        # The timestamp's whole second, formatted once per second (one tuple: threads
        # share the formatter, and a tuple is replaced in one step).
        self._second: tuple[int, str] = (-1, "")

    def _timestamp(self, created: float) -> str:
        second, prefix = self._second
        if int(created) != second:
            second = int(created)
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, prefix)
        return prefix + _MILLISECONDS[int((created - second) * 1000)]

    def request_line(self, fields: dict[str, Any]) -> str:
        """A request's line, as ``format`` would write it for a record of ``ACCESS``: its
        head's JSON, then the fields' (one dict of ~25 keys fewer to build a request)."""
        ts = self._timestamp(time.time())
        if not fields or not fields.keys().isdisjoint(_REQUEST_HEAD_KEYS):  # not the recorder's
            return orjson.dumps({"ts": ts, **_REQUEST_HEAD, **fields}, default=str).decode()
        # In bytes, decoded once: a copy fewer of a line of ~500 characters (0.4 µs).
        line = (
            b'{"ts":"' + ts.encode() + _REQUEST_HEAD_BYTES + orjson.dumps(fields, default=str)[1:]
        )
        return line.decode()

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            line["request_id"] = request_id
        fields = record.__dict__.get("fields")
        if fields:
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...``, request_id first among the fields."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def request_line(self, fields: dict[str, Any]) -> str:
        """A request's line, as ``format`` would write it for a record of ``ACCESS``."""
        now = time.time()
        asctime = time.strftime(self.default_time_format, time.localtime(now))
        head = f"{asctime},{int(now % 1 * 1000):03d}"  # as logging writes %(asctime)s
        values = " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())
        return f"{head} INFO {ACCESS.name} request {values}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        request_id = REQUEST_ID.get()
        fields = record.__dict__.get("fields") or {}
        if request_id is not None and "request_id" not in fields:
            fields = {"request_id": request_id, **fields}
        parts = [text, *(f"{key}={_text_value(value)}" for key, value in fields.items())]
        return " ".join(parts)


def _text_value(value: object) -> str:
    text = str(value)
    if text and _PLAIN.issuperset(text):
        return text
    return orjson.dumps(text).decode()


class _Writer:
    """The thread that writes log lines: every ``_FLUSH_S`` it writes whatever was queued
    in one call. Logging a line only appends it to a deque: no lock, no signal to this
    thread (a QueueListener is woken for every line, and each wake-up costs the event
    loop a hand-over of the GIL). A line reaches stderr at most ``_FLUSH_S`` late.

    A thread does not survive ``fork``: the thread stops before one (writing what is
    queued, so no thread crosses it: proxy.serve.workers forks its workers from a process
    without threads) and starts again after it, in the parent and in the child.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._lines: deque[str] = deque()
        self._stream = stream
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        self._lines.append(line)  # atomic: safe from any thread

    def _run(self) -> None:
        stopping = False
        while not stopping:
            stopping = self._stopping.wait(_FLUSH_S)
            lines = self._lines
            batch = [lines.popleft() for _ in range(len(lines))]
            if not batch:
                continue
            batch.append("")  # the last line's newline: one join, no string a line
            try:
                self._stream.write("\n".join(batch))
                self._stream.flush()
            except (OSError, ValueError):  # stderr closed: there is nowhere left to say so
                pass

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
# it, and exiting drains it. Request lines go to it straight, formatted by ``_lines``.
_writer: _Writer | None = None
_lines: JsonFormatter | TextFormatter | None = None


def _stop_writer() -> None:
    global _writer, _lines
    _lines = None
    if _writer is not None:
        _writer.stop()
        _writer = None


def configured() -> bool:
    """Whether ``configure_logging`` has run in this process: uvicorn then logs through it."""
    return _writer is not None


def write_request_line(fields: dict[str, Any]) -> None:
    """One request's line, at info level on ``ACCESS``."""
    if ACCESS.isEnabledFor(logging.INFO):
        _write_request_line(fields)


def request_line_writer() -> Callable[[dict[str, Any]], None] | None:
    """What ``write_request_line`` writes a line with, None when ``ACCESS`` writes no
    info lines: the recorder asks before it builds one (and the level is checked once)."""
    return _write_request_line if ACCESS.isEnabledFor(logging.INFO) else None


def _write_request_line(fields: dict[str, Any]) -> None:
    """Once ``configure_logging`` has run, the line is formatted and queued here, as its
    handler would: a LogRecord and the logging call around it cost more than the line
    itself (several times its CPU: bench/README.md), and there is one per request. Elsewhere
    (tests, an embedding application) it goes through ``ACCESS`` as any other line.
    """
    writer, lines = _writer, _lines
    if writer is None or lines is None:
        ACCESS.info("request", extra={"fields": fields})
        return
    writer.put(lines.request_line(fields))


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
    global _writer, _lines
    _stop_writer()
    _writer = _Writer(sys.stderr if stream is None else stream)
    atexit.unregister(_stop_writer)  # once, however often this runs
    atexit.register(_stop_writer)
    if not _Hooks.registered:
        os.register_at_fork(
            before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
        )
        multiprocessing.util.register_after_fork(_Hooks, _finalize_in_worker)
        _Hooks.registered = True
    handler = _Enqueue(_writer)
    formatter = JsonFormatter() if settings.format == "json" else TextFormatter()
    handler.setFormatter(formatter)
    _lines = formatter
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in _OURS:
        logging.getLogger(name).setLevel(settings.level.upper())
