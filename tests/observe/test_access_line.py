"""A request's access line is gathered on the request path and formatted by the log writer's
thread (observe/line.py, observe/logs.py): the same bytes as formatting it at once, in order,
never lost (a line that cannot be formatted is an error line), across a fork too."""

from __future__ import annotations

import gc
import io
import logging
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import LoggingSettings, Settings
from proxy.core.cache_cuts import CACHE_PLANS
from proxy.core.outcome import Outcome
from proxy.core.session import session_from_header
from proxy.observe import formats, logs
from proxy.observe.line import LOGGED_VALUE_CHARS, api_resource, clipped, gathered
from proxy.observe.logs import configure_logging, request_line_writer
from proxy.observe.metrics import Metrics
from proxy.observe.metrics.logs import count_unformatted_lines
from proxy.observe.record import Record
from proxy.observe.recorder import Recorder

_HEAD = {"level": "info", "logger": "proxy.access", "msg": "request"}
_FIGURES = st.tuples(
    *[st.integers(-(10**9), 10**9)] * 6, st.booleans(), *[st.integers(0, 10**9)] * 3
)
_CACHE = st.none() | st.sampled_from(
    [("hit", "none"), ("ttl_expiry", "none"), ("prefix_change", "proxy"), ("cold_start", "none")]
)


@pytest.fixture
def configured() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("proxy").level)
    yield
    logs._stop_writer()
    logs.count_unformatted_with(None)
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("proxy").setLevel(saved[2])


def _as_it_was_written(rec: Record, total: float, sensitive: bool, ledgered: Any) -> dict[str, Any]:
    """The line's fields as Recorder._fields wrote them at once (4e8dbce), read plainly."""
    f: dict[str, Any] = {"request_id": rec.request_id, "method": rec.method}
    f.update(route=rec.route, status=rec.status, duration_ms=round(total * 1000, 2))
    if rec.route == "passthrough":
        f["path"] = clipped(rec.path) if sensitive else api_resource(rec.path)
    if rec.error is not None:
        f["error"] = rec.error
    if rec.upstream_status is not None:
        f["upstream_status"] = rec.upstream_status or None
        f["upstream_ms"] = round(rec.upstream_s * 1000, 2)
    if rec.upstream_request_id is not None:
        f["upstream_request_id"] = rec.upstream_request_id
    if rec.event_stream:
        if rec.ttfb_s is not None:
            f["ttfb_ms"] = round(rec.ttfb_s * 1000, 2)
        f["completed"] = rec.completed
    if rec.model is not None:
        model = rec.model
        f["model"] = model if len(model) <= LOGGED_VALUE_CHARS else clipped(model)
        f.update(stream=rec.stream, tenant=rec.tenant[:12])
        if rec.session is not None:
            f["session"] = rec.session.log_id
        elif rec.session_header:
            f["session"] = session_from_header(rec.tenant, rec.session_header).log_id
        if sensitive and rec.session_header is not None:
            f["session_header"] = clipped(rec.session_header)
        if (o := rec.outcome) is not None:
            f["compaction"] = o.status
            before = o.tokens if rec.tokens_before is None else rec.tokens_before
            f.update(tokens_before=before, tokens_after=o.tokens, counted=o.counted)
        if rec.trigger is not None:
            f["trigger"] = rec.trigger
        if rec.summary_s is not None:
            f["summary_ms"] = round(rec.summary_s * 1000, 2)
        if rec.summary_failed_s:
            f["summary_failed_ms"] = round(rec.summary_failed_s * 1000, 2)
        if rec.cache_plan is not None:
            f["cache_plan"] = rec.cache_plan
    if ledgered is not None:
        figures, money, cache = ledgered
        names = ("would_send", "sent", "cached", "would_cached", "summarizer_input")
        names += ("summarizer_output", "estimated", "written_5m", "written_1h", "would_written")
        f.update(zip((f"ledger_{n}" for n in names), figures, strict=True))
        f["ledger_net"] = figures[0] - figures[1] - figures[4] - figures[5]
        if money is not None:
            f["ledger_money_saved_usd"] = round(money, 6)
        if cache is not None:
            f["ledger_cache"] = cache[0]
            if cache[1] != "none":
                f["ledger_cache_cause"] = cache[1]
    return f


_TEXT = st.text(min_size=0, max_size=40) | st.sampled_from(
    ["é", '"quoted"\n', "\u2028\x00\ud7ff", "x" * 1100, "/v1/files/a b", "/v1/chat/completions"]
)
_MAYBE_S = st.none() | st.floats(0, 1e5, allow_nan=False)


@st.composite
def _records(draw: st.DrawFn) -> Record:
    rec = Record(draw(st.text(min_size=1, max_size=20)), perf_counter(), draw(_TEXT), draw(_TEXT))
    rec.route = draw(st.sampled_from(["chat", "passthrough", "other", "responses"]))
    rec.status = draw(st.integers(0, 599))
    rec.error = draw(st.none() | _TEXT)
    rec.upstream_status = draw(st.none() | st.integers(0, 599))
    rec.upstream_s = draw(st.floats(0, 1e4, allow_nan=False))
    rec.upstream_request_id = draw(st.none() | _TEXT)
    rec.event_stream, rec.completed = draw(st.booleans()), draw(st.booleans())
    rec.ttfb_s = draw(_MAYBE_S)
    rec.model = draw(st.none() | _TEXT)
    rec.stream, rec.tenant = draw(st.booleans()), draw(_TEXT)
    rec.session_header = draw(st.none() | _TEXT)
    if draw(st.booleans()):
        rec.session = session_from_header(rec.tenant, "s")
    if draw(st.booleans()):
        tokens = draw(st.integers(0, 10**7))
        rec.outcome = (
            Outcome.unchanged(tokens, 1000) if tokens % 2 else Outcome.passthrough(b"x", 9)
        )
    rec.tokens_before = draw(st.none() | st.integers(0, 10**7))
    rec.trigger = draw(st.none() | _TEXT)
    rec.summary_s = draw(_MAYBE_S)
    rec.summary_failed_s = draw(st.floats(0, 1e4, allow_nan=False))
    rec.cache_plan = draw(st.none() | st.sampled_from(CACHE_PLANS))
    return rec


# No deadline: each example builds a metrics registry and starts the log writer's thread,
# whose time is the machine's load, not the code's: on a busy runner one example overran
# hypothesis's default deadline and ran well inside it on the rerun (a flaky failure).
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rec=_records(),
    total=st.floats(0, 1e5, allow_nan=False),
    sensitive=st.booleans(),
    ledgered=st.none()
    | st.tuples(_FIGURES, st.none() | st.floats(-1e6, 1e6, allow_nan=False), _CACHE),
    fmt=st.sampled_from(["json", "text"]),
)
def test_a_request_line_is_the_bytes_it_was_when_formatted_at_once(
    configured: None, rec: Record, total: float, sensitive: bool, ledgered: Any, fmt: Any
) -> None:
    """Gathered, then formatted by the writer's thread: byte for byte the line formatted
    on the request path as before, odd, non-ASCII, long and hostile values included."""
    buffer = io.StringIO()
    configure_logging(LoggingSettings(format=fmt), stream=buffer)
    recorder = Recorder(Metrics.create(), Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    recorder._line = type(recorder._line)(sensitive)
    named = None
    if rec.model is not None and rec.session is None and rec.session_header:
        named = recorder.ledger.named.of(rec.tenant, rec.session_header)[1]
    write = request_line_writer()
    assert write is not None
    before = time.time()
    write(rec.request_id, recorder._line.fields, gathered(rec, total, named, ledgered))
    logs._stop_writer()
    (line, end) = buffer.getvalue().split("\n")  # a value's U+2028 is no line's end
    assert end == ""
    fields = _as_it_was_written(rec, total, sensitive, ledgered)
    if fmt == "json":
        ts = orjson.loads(line)["ts"]
        assert line == orjson.dumps({"ts": ts, **_HEAD, **fields}, default=str).decode()
        assert ts >= logs.JsonFormatter()._timestamp(int(before))  # logged when written
    else:
        values = " ".join(f"{k}={formats._text_value(v)}" for k, v in fields.items())
        head, rest = line[:23], line[24:]
        assert rest == f"INFO proxy.access request {values}"
        assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(before)) <= head[:19]


def test_a_line_is_the_record_as_it_ended_not_as_it_is_formatted(configured: None) -> None:
    """A record noted on after it ended (a late summary's time) keeps the line it had."""
    buffer = io.StringIO()
    configure_logging(LoggingSettings(), stream=buffer)
    recorder = Recorder(Metrics.create(), Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    rec = Record("r-1", perf_counter(), "POST", "/v1/chat/completions", route="chat")
    rec.model, rec.tenant, rec.status = "m", "t", 200
    recorder.finish(rec)
    rec.summary_s, rec.trigger, rec.status = 1.5, "late", 500
    logs._stop_writer()
    (line,) = (orjson.loads(x) for x in buffer.getvalue().splitlines())
    assert (line["status"], "summary_ms" in line, "trigger" in line) == (200, False, False)


class _Messages(list[Any]):
    """A conversation that can be watched (a list subclass takes a weak reference)."""


def test_a_queued_line_holds_none_of_the_requests_conversation(
    configured: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What waits for the writer is the line's values, not the request's view: a stalled
    stderr (the writer's reason to be) must not pin every compacted conversation (hundreds
    of KB a request, against the ~500 bytes of a line formatted at once)."""
    monkeypatch.setattr(logs, "_FLUSH_S", 30.0)  # the writer waits: the line stays queued
    buffer = io.StringIO()
    configure_logging(LoggingSettings(), stream=buffer)
    recorder = Recorder(Metrics.create(), Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    rec = Record("r-1", perf_counter(), "POST", "/v1/chat/completions", route="chat")
    rec.model, rec.tenant, rec.status = "m", "t", 200
    messages = _Messages([{"role": "user", "content": "x" * 100_000}])
    rec.outcome = Outcome.rebuilt(messages, 3, 40, 1000)
    watched = weakref.ref(messages)
    recorder.finish(rec)
    del rec, messages
    gc.collect()
    held = watched() is not None
    logs._stop_writer()
    (line,) = (orjson.loads(x) for x in buffer.getvalue().splitlines())
    assert (line["compaction"], line["tokens_after"]) == ("snapshot", 40)
    assert not held


def test_a_line_that_cannot_be_formatted_is_an_error_line_and_the_rest_go_on(
    configured: None,
) -> None:
    buffer = io.StringIO()
    configure_logging(LoggingSettings(), stream=buffer)
    write = request_line_writer()
    assert write is not None

    def fields(n: int) -> dict[str, Any]:
        if n == 1:
            raise ValueError("a value it cannot read")
        return {"request_id": f"r-{n}", "n": n}

    for n in range(3):
        write(f"r-{n}", fields, n)
    time.sleep(logs._FLUSH_S * 3)  # written by the running thread, which goes on
    write("r-3", fields, 3)
    assert logs._writer is not None
    assert logs._writer.unformatted == 1
    logs._stop_writer()
    lines = [orjson.loads(x) for x in buffer.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["r-0", "r-1", "r-2", "r-3"]
    assert lines[1]["level"] == "error"
    assert lines[1]["msg"] == "request line not formatted: ValueError"
    assert [line.get("n") for line in lines] == [0, None, 2, 3]


_UNFORMATTED = "compaction_proxy_request_lines_unformatted_total"


def _unreadable(n: int) -> dict[str, Any]:
    raise ValueError(f"value {n} it cannot read")


def test_lines_not_formatted_are_counted_on_the_last_registry_given_before_or_after_the_writer(
    configured: None,
) -> None:
    """Nothing degraded silently: each such line counts on the app's metrics too, which may
    be made before logging is configured (or configured again after) and are one per
    process, as the writer is (services.py gives them once its app's metrics exist)."""
    first, second = CollectorRegistry(), CollectorRegistry()
    count_unformatted_lines(first)
    assert first.get_sample_value(_UNFORMATTED) == 0
    configure_logging(LoggingSettings(), stream=io.StringIO())
    write = request_line_writer()
    assert write is not None
    write("r-0", _unreadable, 0)
    write("r-1", _as_fields, 1)  # formatted: not counted
    logs._stop_writer()
    assert first.get_sample_value(_UNFORMATTED) == 1
    count_unformatted_lines(second)
    configure_logging(LoggingSettings(format="text"), stream=io.StringIO())
    for n in (2, 3):
        write(f"r-{n}", _unreadable, n)
    logs._stop_writer()
    assert (first.get_sample_value(_UNFORMATTED), second.get_sample_value(_UNFORMATTED)) == (1, 2)


def test_a_count_that_fails_stops_neither_the_line_nor_the_writer(configured: None) -> None:
    def failing() -> None:
        raise OSError("no space left to grow the metric's file")

    logs.count_unformatted_with(failing)
    buffer = io.StringIO()
    configure_logging(LoggingSettings(), stream=buffer)
    write = request_line_writer()
    assert write is not None
    write("r-0", _unreadable, 0)
    time.sleep(logs._FLUSH_S * 3)  # written by the running thread, which goes on
    write("r-1", _as_fields, 1)
    logs._stop_writer()
    lines = [orjson.loads(x) for x in buffer.getvalue().splitlines()]
    assert [(line["request_id"], line["level"]) for line in lines] == [
        ("r-0", "error"),
        ("r-1", "info"),
    ]


def _as_fields(n: int) -> dict[str, Any]:
    return {"request_id": f"r-{n}"}


_WORKERS = """
import multiprocessing, sys
from prometheus_client import CollectorRegistry
from proxy.config import LoggingSettings
from proxy.observe.metrics.exposition import enable_multiprocess, exposition
from proxy.observe.metrics.logs import count_unformatted_lines
from proxy.observe.logs import configure_logging, request_line_writer

directory = sys.argv[1]

def unreadable(n):
    raise ValueError(n)

def work(lines):
    enable_multiprocess(directory)  # as a worker does (proxy.serve.workers), then its app
    count_unformatted_lines(CollectorRegistry())
    write = request_line_writer()
    for n in range(lines):
        write(f"r-{n}", unreadable, n)
    # the worker ends: its finalizer writes what is queued, counting as it goes

configure_logging(LoggingSettings(format="json"))  # the supervisor's, before it forks
fork = multiprocessing.get_context("fork")
workers = [fork.Process(target=work, args=(lines,)) for lines in (1, 2)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join(10)
    assert worker.exitcode == 0
enable_multiprocess(directory)
sys.stdout.write(exposition(CollectorRegistry()).decode())
"""


@pytest.mark.e2e
def test_lines_not_formatted_by_two_workers_are_summed_on_metrics(tmp_path: Path) -> None:
    """server.workers > 1: each worker's writer counts its own lines, in the metrics
    directory's files, and /metrics (any worker's, or after they exit) shows the sum."""
    run = subprocess.run(
        [sys.executable, "-c", _WORKERS, str(tmp_path)], capture_output=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    errors = [orjson.loads(x) for x in run.stderr.splitlines()]
    assert sorted(e["request_id"] for e in errors) == ["r-0", "r-0", "r-1"]
    assert {e["msg"] for e in errors} == {"request line not formatted: ValueError"}
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(run.stdout.decode())
        for s in family.samples
    }
    assert samples[_UNFORMATTED] == 3


_FORKING = """
import multiprocessing, os
from proxy.config import LoggingSettings
from proxy.observe.logs import configure_logging, request_line_writer

def line(n):
    return {"request_id": f"r-{n}", "pid": os.getpid()}

def leave():
    request_line_writer()("r-child", line, "child")  # then the process ends at once

configure_logging(LoggingSettings(format="json"))
write = request_line_writer()
for n in range(3):
    write(f"r-{n}", line, n)  # queued as values when the worker forks
worker = multiprocessing.get_context("fork").Process(target=leave)
worker.start()
worker.join(10)
assert worker.exitcode == 0
write("r-3", line, 3)
"""


@pytest.mark.e2e
def test_request_lines_queued_across_a_fork_are_written_once_each() -> None:
    run = subprocess.run([sys.executable, "-c", _FORKING], capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = [orjson.loads(x) for x in run.stderr.splitlines()]
    ids = [line["request_id"] for line in lines]
    assert sorted(ids) == ["r-0", "r-1", "r-2", "r-3", "r-child"]
    assert ids.index("r-0") < ids.index("r-1") < ids.index("r-2") < ids.index("r-3")
    parent = {line["pid"] for line in lines if line["request_id"] != "r-child"}
    assert len(parent) == 1
    assert lines[ids.index("r-child")]["pid"] not in parent


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _strings(item)


@pytest.mark.parametrize("include_sensitive", [True, False])
def test_a_queued_line_holds_at_most_what_it_logs_of_a_long_client_chosen_value(
    configured: None, monkeypatch: pytest.MonkeyPatch, include_sensitive: bool
) -> None:
    """A path is bounded only by the request head (64 KiB), a session header by a header's
    limit, a model by a configurable cap: what waits for a stalled writer holds the ~1 KiB
    of each its line copies, and the line is the one it was."""
    monkeypatch.setattr(logs, "_FLUSH_S", 30.0)  # the writer waits: the line stays queued
    buffer = io.StringIO()
    logging_settings = LoggingSettings(include_sensitive=include_sensitive)
    configure_logging(logging_settings, stream=buffer)
    upstream = {"base_url": "http://127.0.0.1:9/v1"}
    recorder = Recorder(Metrics.create(), Settings(upstream=upstream, logging=logging_settings))
    path = "/v1/files/" + "p" * 60_000
    rec = Record("r-1", perf_counter(), "GET", path, route="passthrough")
    rec.status = 200
    recorder.finish(rec)
    chat = Record("r-2", perf_counter(), "POST", "/v1/chat/completions", route="chat")
    chat.model, chat.tenant, chat.status = "m" * 5_000, "t", 200
    chat.session_header = "s" * 5_000
    recorder.finish(chat)
    assert logs._writer is not None
    queued = list(logs._writer._queued)
    longest = max(len(s) for s in _strings(queued))
    logs._stop_writer()
    first, second = (orjson.loads(x) for x in buffer.getvalue().splitlines())
    if include_sensitive:
        assert first["path"] == "/v1/files/" + "p" * (LOGGED_VALUE_CHARS - 10) + "…(60010 chars)"
        assert second["session_header"] == "s" * LOGGED_VALUE_CHARS + "…(5000 chars)"
    else:
        assert first["path"] == "/v1/files/…"
        assert "session_header" not in second
    assert second["model"] == "m" * LOGGED_VALUE_CHARS + "…(5000 chars)"
    assert longest <= LOGGED_VALUE_CHARS + 20
