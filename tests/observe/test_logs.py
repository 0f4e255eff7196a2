"""Issue 10: request ids, one structured line per request, and the logging set-up,
in-process.

Through ``compaction-proxy serve`` as its own process, configured from YAML as in
production, reading what it wrote to stderr: tests/e2e/test_logs_e2e.py.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any, Literal

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config import LoggingSettings, Settings
from proxy.core.session import session_from_header
from proxy.observe import logs
from proxy.observe.logs import REQUEST_ID, configure_logging
from proxy.observe.metrics import Metrics
from proxy.observe.record import Record
from proxy.observe.recorder import Recorder, api_resource
from proxy.observe.request_id import request_id_from, response_headers
from tests.support.logs import HEX_ID
from tests.support.twins import write_request_line

# --- request ids: the pure part -------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ([b"trace-42"], "trace-42"),
        ([b"a1b2:c3/d4+e5=f6@g7.h8_i9"], "a1b2:c3/d4+e5=f6@g7.h8_i9"),
        ([b"x" * 128], "x" * 128),
        ([b"x" * 129], None),  # too long
        ([b"has space"], None),
        ([b"line\nbreak"], None),
        ([b'quote"d'], None),
        ([b""], None),
        ([b"\xc3\xa9t\xc3\xa9"], None),  # not ASCII
        ([b"bad id", b"good-id"], "good-id"),  # several: the first well-formed one
        ([], None),
    ],
)
def test_a_request_id_is_kept_when_well_formed_else_generated(
    given: list[bytes], kept: str | None
) -> None:
    headers = [(b"host", b"proxy"), *((b"x-request-id", v) for v in given)]
    request_id, out = request_id_from(headers)
    if kept is None:
        assert HEX_ID.fullmatch(request_id)
    else:
        assert request_id == kept
    # The request goes on with exactly one id, the one that is logged and returned.
    assert [v for k, v in out if k == b"x-request-id"] == [request_id.encode()]
    assert (b"host", b"proxy") in out


def test_generated_request_ids_differ() -> None:
    assert len({request_id_from([])[0] for _ in range(1000)}) == 1000


# --- formatters ------------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[Callable[[LoggingSettings], io.StringIO]]:
    """``configure_logging`` into a buffer; the test process's logging restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("proxy").level)

    def configure(settings: LoggingSettings) -> io.StringIO:
        buffer = io.StringIO()
        configure_logging(settings, stream=buffer)
        return buffer

    yield configure
    logs._stop_writer()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("proxy").setLevel(saved[2])


def _flushed(buffer: io.StringIO) -> list[str]:
    logs._stop_writer()  # writes everything queued
    return buffer.getvalue().splitlines()


def test_json_lines_carry_the_request_id_and_the_fields(
    captured: Callable[[LoggingSettings], io.StringIO],
) -> None:
    buffer = captured(LoggingSettings(format="json"))
    token = REQUEST_ID.set("req-1")
    try:
        logging.getLogger("proxy.test").warning("odd %s", "thing", extra={"fields": {"n": 3}})
    finally:
        REQUEST_ID.reset(token)
    logging.getLogger("proxy.test").warning("outside any request")
    first, second = (orjson.loads(line) for line in _flushed(buffer))
    assert first == {
        "ts": first["ts"],
        "level": "warning",
        "logger": "proxy.test",
        "msg": "odd thing",
        "request_id": "req-1",
        "n": 3,
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert "request_id" not in second


def test_text_lines_quote_values_that_would_break_the_line(
    captured: Callable[[LoggingSettings], io.StringIO],
) -> None:
    buffer = captured(LoggingSettings(format="text"))
    fields = {"path": "/v1/a b\nFAKE LINE", "route": "passthrough"}
    logging.getLogger("proxy.test").warning("request", extra={"fields": fields})
    (line,) = _flushed(buffer)
    assert line.endswith(' request path="/v1/a b\\nFAKE LINE" route=passthrough')


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_request_lines_are_written_as_the_configured_format_writes_any_line(
    captured: Callable[[LoggingSettings], io.StringIO], fmt: Literal["json", "text"]
) -> None:
    """Request lines skip the logging call (one per request) but look the same."""
    buffer = captured(LoggingSettings(format=fmt))
    fields = {"request_id": "r-1", "route": "chat", "path": "/v1/a b"}
    write_request_line(fields)
    logs.ACCESS.info("request", extra={"fields": fields})
    direct, logged = _flushed(buffer)
    if fmt == "json":
        assert {**orjson.loads(direct), "ts": ""} == {**orjson.loads(logged), "ts": ""}
    else:  # the same but for the time
        assert direct.split(" ", 2)[2] == logged.split(" ", 2)[2]
        assert direct.endswith(
            ' INFO proxy.access request request_id=r-1 route=chat path="/v1/a b"'
        )


def test_request_lines_go_through_logging_when_it_was_not_configured_here(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="proxy.access"):
        write_request_line({"request_id": "r-2"})
    (record,) = caplog.records
    assert record.__dict__["fields"] == {"request_id": "r-2"}


def test_the_level_applies_to_the_proxy_and_other_libraries_stay_at_warnings(
    captured: Callable[[LoggingSettings], io.StringIO],
) -> None:
    buffer = captured(LoggingSettings(level="debug"))
    logging.getLogger("proxy.test").debug("ours")
    logging.getLogger("some.library").info("theirs")
    assert [orjson.loads(line)["msg"] for line in _flushed(buffer)] == ["ours"]


# --- request ids end to end ------------------------------------------------------------


# --- the proxy's own log output --------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/v1/files/file-abc/content", "/v1/files/…"),
        ("/v1/embeddings", "/v1/embeddings"),
        ("/v1/secret-value/..", "other"),
        ("/v2/models", "other"),
        ("/", "other"),
    ],
)
def test_a_passthrough_line_names_the_resource_not_the_callers_path(path: str, logged: str) -> None:
    assert api_resource(path) == logged


@pytest.mark.parametrize(
    "fields",
    [
        {"request_id": "r-1", "route": "chat", "status": 200, "ledger_net": -3, "stream": False},
        {"request_id": "r-1", "path": 'a "quoted"\n path', "model": "é"},
        {"request_id": "r-1", "msg": "theirs"},  # a head key: the fields' value, in place
        {},
    ],
)
def test_a_json_request_line_is_its_head_and_fields_as_one_object(fields: dict[str, Any]) -> None:
    """The line is spliced from its head's JSON and the fields' (no merged dict): the
    same string as dumping the merged object, key order included."""
    line = logs.JsonFormatter().request_line(fields)
    ts = orjson.loads(line)["ts"]
    head = {"ts": ts, "level": "info", "logger": "proxy.access", "msg": "request"}
    assert line == orjson.dumps({**head, **fields}).decode()


def test_request_lines_are_written_once_each_in_order_across_batches_and_at_shutdown(
    captured: Callable[[LoggingSettings], io.StringIO],
) -> None:
    # The writer drains what was queued every _FLUSH_S: lines logged meanwhile, over several
    # of its batches, and the last ones just before it stops, all arrive, once, in order.
    buffer = captured(LoggingSettings(format="json"))
    n = 0
    for _ in range(4):
        for _ in range(2500):
            write_request_line({"request_id": f"req-{n}", "n": n})
            n += 1
        time.sleep(logs._FLUSH_S * 1.5)
    write_request_line({"request_id": "last", "n": n})
    lines = _flushed(buffer)
    assert buffer.getvalue().endswith("}\n")
    assert [orjson.loads(line)["n"] for line in lines] == list(range(n + 1))


@given(st.floats(min_value=1.0, max_value=4e9, allow_nan=False))
def test_a_timestamp_is_its_second_and_millisecond_as_formatted_once(created: float) -> None:
    """The milliseconds come from a table: the same text as formatting them."""
    second = int(created)
    prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    expected = f"{prefix}.{int((created - second) * 1000):03d}Z"
    assert logs.JsonFormatter()._timestamp(created) == expected


_OWN = (b"x-request-id", b"ours")
_NAMES = [
    b"content-type",
    b"Content-Type",
    b"x-request-id",
    b"X-Request-ID",
    b"date",
    b"x-twelve-byt",
]
_VALUES = [b"text/event-stream; charset=utf-8", b"TEXT/EVENT-STREAM", b"application/json"]
_HEADERS = st.lists(
    st.tuples(st.sampled_from(_NAMES), st.sampled_from([*_VALUES, b"theirs", b"ours", b"b d"]))
)


def _as_the_record_answers(
    headers: list[tuple[bytes, bytes]],
) -> tuple[list[tuple[bytes, bytes]], str | None, bool]:
    """The response's headers as RecordRequests sends them, read plainly: the upstream's
    id renamed (an echo of ours dropped), ours last; its last well-formed id; a stream?"""
    out, upstream_id, stream = [], None, False
    for name, value in headers:
        if name.lower() == b"x-request-id":
            if value != _OWN[1]:
                out.append((b"x-upstream-request-id", value))
                if re.fullmatch(rb"[A-Za-z0-9._:+=/@-]{1,128}", value):
                    upstream_id = value.decode()
            continue
        stream = stream or (
            name.lower() == b"content-type" and value.lower().startswith(b"text/event-stream")
        )
        out.append((name, value))
    return [*out, _OWN], upstream_id, stream


@given(_HEADERS)
def test_a_responses_headers_carry_our_id_and_the_upstreams_renamed(
    headers: list[tuple[bytes, bytes]],
) -> None:
    assert response_headers(headers, _OWN) == _as_the_record_answers(headers)
    assert response_headers(iter(headers), _OWN) == _as_the_record_answers(headers)


def test_a_line_names_a_named_session_by_its_log_id_only() -> None:
    """A request that names its session (uncounted: no derived one on its record) is
    logged under the same short id as a counted one, never its store key nor its name."""
    recorder = Recorder(Metrics.create(), Settings(upstream={"base_url": "http://127.0.0.1:9/v1"}))
    for _ in range(2):  # the second from what the first hashed
        rec = Record("r", perf_counter(), "POST", "/v1/chat/completions", route="chat")
        rec.model, rec.tenant, rec.session_header = "m", "t" * 64, "my-session"
        fields = recorder._fields(rec, 0.001)
        assert fields["session"] == session_from_header("t" * 64, "my-session").log_id
