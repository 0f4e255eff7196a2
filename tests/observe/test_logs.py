"""Issue 10: request ids on both hops, one structured line per request, no secrets in logs.

The log tests run ``compaction-proxy serve`` as its own process, configured from YAML
as in production, and read what it wrote to stderr.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import orjson
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from proxy.config import LoggingSettings
from proxy.observe import logs
from proxy.observe.logs import REQUEST_ID, configure_logging, write_request_line
from proxy.observe.recorder import api_resource
from proxy.observe.request_id import request_id_from
from tests.support.chat import WINDOW, small_window_settings, upstream_requests
from tests.support.logs import HEX_ID
from tests.support.metrics import long_history
from tests.support.processes import CHAT, SlowStream, serve_process
from tests.support.servers import OPEN_CLIENTS, free_port, proxy_settings, run_server

HASH = re.compile(r"[0-9a-f]{12}")

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


_FORKED_WORKER = """
import logging, multiprocessing
from proxy.config import LoggingSettings
from proxy.observe.logs import configure_logging

def leave():
    logging.getLogger("proxy.test").warning("last words")  # then the process ends at once

configure_logging(LoggingSettings(format="text"))
worker = multiprocessing.get_context("fork").Process(target=leave)
worker.start()
worker.join(10)
assert worker.exitcode == 0
"""


@pytest.mark.e2e
def test_a_forked_worker_writes_its_last_line_before_it_exits() -> None:
    """A multiprocessing worker leaves through os._exit (no atexit): its lines still out."""
    run = subprocess.run(
        [sys.executable, "-c", _FORKED_WORKER], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert "last words" in run.stderr


# --- request ids end to end ------------------------------------------------------------


def sdk(url: str, key: str = "sk-ids") -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    OPEN_CLIENTS.append(client)
    return client


def test_a_client_request_id_is_returned_and_forwarded(proxy: str, sim_reset: str) -> None:
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model="sim-4k",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Request-Id": "trace-42"},
    )
    assert raw.headers["x-request-id"] == "trace-42"
    (forwarded,) = upstream_requests(sim_reset)
    assert forwarded["headers"]["x-request-id"] == "trace-42"


@pytest.mark.parametrize("given", [None, "not a valid id", "x" * 200])
def test_a_missing_or_malformed_request_id_is_replaced_on_both_hops(
    proxy: str, sim_reset: str, given: str | None
) -> None:
    headers = {} if given is None else {"X-Request-Id": given}
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model="sim-4k", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
    )
    request_id = raw.headers["x-request-id"]
    assert HEX_ID.fullmatch(request_id)
    (forwarded,) = upstream_requests(sim_reset)
    assert forwarded["headers"]["x-request-id"] == request_id


def test_summary_calls_carry_the_request_id_of_the_request_that_compacts(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(sim_reset))
    raw = sdk(url).chat.completions.with_raw_response.create(
        model="sim-4k",
        messages=long_history(50),
        extra_headers={"X-Request-Id": "compact-7", "X-Sim-Context-Window": str(WINDOW)},
    )
    assert raw.headers["x-compaction-status"] == "compacted"
    seen = upstream_requests(sim_reset)
    summaries = [r for r in seen if r["headers"].get("x-compaction-purpose") == "summarize"]
    assert summaries
    assert {r["headers"]["x-request-id"] for r in seen} == {"compact-7"}


@pytest.fixture
def echo_upstream() -> Iterator[str]:
    """An upstream that answers with its own X-Request-Id and echoes the one it got."""

    async def echo(request: Request) -> JSONResponse:
        got = request.headers.get("x-request-id")
        return JSONResponse({"got": got}, headers={"X-Request-Id": "upstream-own-1"})

    app = Starlette(routes=[Route("/v1/{path:path}", echo, methods=["GET", "POST"])])
    with run_server(app) as url:
        yield url


@pytest.mark.e2e
def test_errors_and_relayed_answers_carry_our_id_and_the_upstreams_is_renamed(
    echo_upstream: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(echo_upstream, upstream={"api_key": "sk-proxy-own"}))
    auth = {"Authorization": "Bearer sk-client", "X-Request-Id": "mine-1"}
    relayed = httpx.get(f"{url}/v1/models", headers=auth)
    assert relayed.json() == {"got": "mine-1"}
    assert relayed.headers.get_list("x-request-id") == ["mine-1"]
    assert relayed.headers["x-upstream-request-id"] == "upstream-own-1"
    refused = httpx.get(f"{url}/v1/models")  # no client key: 401 from the proxy itself
    assert refused.status_code == 401
    assert HEX_ID.fullmatch(refused.headers["x-request-id"])
    unknown = httpx.get(f"{url}/elsewhere", headers={"X-Request-Id": "lost-1"})
    assert unknown.status_code == 404
    assert unknown.headers["x-request-id"] == "lost-1"


# --- the proxy's own log output --------------------------------------------------------

API_KEY = "sk-SECRET-apikey-5f1e"
SESSION = "SECRET-session-7c2d"
CONTENT = "SECRET-content-9a4b"
ADMIN_KEY = "SECRET-adminkey-3e8f"
WRONG_ADMIN_KEY = "SECRET-wrongadmin-1d6a"
SECRETS = (API_KEY, SESSION, CONTENT, ADMIN_KEY, WRONG_ADMIN_KEY)


def serve_logged(tmp_path: Path, sim: str, **logging_config: Any) -> tuple[str, Any, Path]:
    """``compaction-proxy serve`` at debug level with JSON lines on stderr (to a file)."""
    port = free_port()
    config = {
        "upstream": {"base_url": f"{sim}/v1"},
        "server": {"admin_key": ADMIN_KEY},
        "models": [{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        "compaction": {"summary_max_tokens": 400},
        "logging": {"format": "json", "level": "debug", **logging_config},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    stderr = tmp_path / "stderr.log"
    cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", str(port)]
    with stderr.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return url, process, stderr
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"proxy did not start: {stderr.read_text()[-2000:]}")
        time.sleep(0.1)


def stop(process: Any) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def traffic(url: str) -> None:
    """Every kind of request, each carrying the secrets where a client would put them."""
    client = sdk(url, key=API_KEY)
    session = {"X-Session-Id": SESSION, "X-Sim-Context-Window": str(WINDOW)}
    history = long_history(50)
    history[1]["content"] += f" my password is {CONTENT}"
    compacted = client.chat.completions.with_raw_response.create(
        model="sim-4k", messages=history, extra_headers={**session, "X-Request-Id": "compacted"}
    )
    assert compacted.headers["x-compaction-status"] == "compacted"
    history += [
        {"role": "assistant", "content": f"noted {CONTENT}"},
        {"role": "user", "content": f"repeat {CONTENT}"},
    ]
    stream = client.chat.completions.create(
        model="sim-4k",
        messages=history,
        stream=True,
        extra_headers={**session, "X-Request-Id": "streamed"},
    )
    with stream:
        assert sum(1 for _ in stream) > 1
    auth = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "sim-4k", "stream": True, "messages": [{"role": "user", "content": CONTENT}]}
    slow = {**auth, "X-Request-Id": "abandoned", "X-Sim-Chunk-Delay-Ms": "300"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=slow) as left:
        chunks = left.iter_bytes()
        next(chunks)  # then the client leaves
    assert httpx.get(f"{url}/sessions/{SESSION}", headers=auth).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.get(f"{url}/admin/sessions", headers=admin).status_code == 200
    wrong = {"Authorization": f"Bearer {WRONG_ADMIN_KEY}"}
    assert httpx.get(f"{url}/admin/sessions", headers=wrong).status_code == 401
    failing = client.chat.completions.with_raw_response
    with pytest.raises(openai.InternalServerError):
        failing.create(
            model="sim-4k",
            messages=[{"role": "user", "content": CONTENT}],
            extra_headers={**session, "X-Sim-Fail": "500"},
        )


def request_lines(lines: list[str]) -> dict[str, dict[str, Any]]:
    parsed = [orjson.loads(line) for line in lines if line.startswith("{")]
    return {p["request_id"]: p for p in parsed if p["logger"] == "proxy.access"}


@pytest.fixture(scope="module")
def debug_log(simulator: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What a proxy at debug level wrote to stderr while serving ``traffic``."""
    httpx.delete(f"{simulator}/_sim/requests")
    url, process, stderr = serve_logged(tmp_path_factory.mktemp("debug"), simulator)
    try:
        traffic(url)
    finally:
        stop(process)
    return stderr.read_text().splitlines()


def test_no_secret_reaches_the_logs_at_debug_level(debug_log: list[str]) -> None:
    assert len(request_lines(debug_log)) == 8  # every request: the /healthz probes are not
    for line in debug_log:
        for secret in SECRETS:
            assert secret not in line
        assert "Bearer" not in line


def test_a_request_line_reports_compaction_tokens_and_timings(debug_log: list[str]) -> None:
    lines = debug_log
    requests = request_lines(lines)
    compacted, streamed = requests["compacted"], requests["streamed"]
    assert compacted["route"] == "chat"
    assert compacted["status"] == 200
    assert compacted["model"] == "sim-4k"
    assert compacted["compaction"] == "compacted"
    assert compacted["trigger"] == "threshold"
    assert compacted["tokens_before"] > compacted["tokens_after"] > 0
    assert compacted["stream"] is False
    assert compacted["upstream_status"] == 200
    assert compacted["duration_ms"] > compacted["upstream_ms"] + compacted["summary_ms"] * 0.99
    assert HASH.fullmatch(compacted["tenant"])
    assert HASH.fullmatch(compacted["session"])
    assert streamed["session"] == compacted["session"]
    assert streamed["tenant"] == compacted["tenant"]
    assert streamed["stream"] is True
    assert streamed["completed"] is True
    assert 0 < streamed["ttfb_ms"] <= streamed["duration_ms"]
    assert streamed["compaction"] in ("snapshot", "compacted")
    # Lines logged while serving a request carry its id: the compaction's own line.
    compaction = [orjson.loads(x) for x in lines if '"logger":"proxy.compaction"' in x]
    assert [c["request_id"] for c in compaction] == ["compacted"]
    assert requests["abandoned"]["completed"] is False
    failed = [r for r in requests.values() if r.get("upstream_status") == 500]
    assert [f["status"] for f in failed] == [500]


def test_include_sensitive_adds_the_session_header_and_nothing_else(
    sim_reset: str, tmp_path: Path
) -> None:
    url, process, stderr = serve_logged(tmp_path, sim_reset, include_sensitive=True)
    try:
        traffic(url)
    finally:
        stop(process)
    lines = stderr.read_text().splitlines()
    assert request_lines(lines)["compacted"]["session_header"] == SESSION
    for line in lines:
        for secret in (API_KEY, CONTENT, ADMIN_KEY, WRONG_ADMIN_KEY):
            assert secret not in line


def test_every_worker_writes_its_request_lines_up_to_its_exit(
    sim_reset: str, tmp_path: Path
) -> None:
    """Workers are forked from the process that set up logging: each writes its own lines,
    the last ones too (a stream that ends during the drain, just before the worker exits)."""
    config = {"upstream": {"base_url": f"{sim_reset}/v1"}, "server": {"workers": 2}}
    with serve_process(tmp_path, config) as served:
        assert len(served.children()) == 2
        for i in range(12):  # fresh connections: the kernel spreads them over both workers
            headers = {"X-Request-Id": f"w-{i}"}
            assert httpx.post(f"{served.url}/v1/chat/completions", json=CHAT, headers=headers)
        stream = SlowStream(served.url, chunk_delay_ms=200).start()
        served.process.terminate()
        stream.join(timeout=30)
        assert served.wait(timeout=30) == 0
    assert stream.error is None
    lines = [orjson.loads(x) for x in served.log().splitlines() if x.startswith("{")]
    requests = [line for line in lines if line["logger"] == "proxy.access"]
    assert {r["request_id"] for r in requests} >= {f"w-{i}" for i in range(12)}
    assert [r.get("stream") for r in requests].count(True) == 1


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
