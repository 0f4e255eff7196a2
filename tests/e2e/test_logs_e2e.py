"""Issue 10: request ids on both hops, one structured line per request, no secrets in logs.

The log tests run ``compaction-proxy serve`` as its own process, configured from YAML
as in production, and read what it wrote to stderr. In-process: tests/observe/test_logs.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.chat import WINDOW, small_window_settings, upstream_requests
from tests.support.logs import HEX_ID
from tests.support.metrics import long_history
from tests.support.processes import CHAT, SlowStream, serve_process
from tests.support.servers import OPEN_CLIENTS, proxy_settings, run_server
from tests.support.starting import start_listening

HASH = re.compile(r"[0-9a-f]{12}")


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


API_KEY = "sk-SECRET-apikey-5f1e"


SESSION = "SECRET-session-7c2d"


CONTENT = "SECRET-content-9a4b"


ADMIN_KEY = "SECRET-adminkey-3e8f"


WRONG_ADMIN_KEY = "SECRET-wrongadmin-1d6a"


SECRETS = (API_KEY, SESSION, CONTENT, ADMIN_KEY, WRONG_ADMIN_KEY)


def serve_logged(tmp_path: Path, sim: str, **logging_config: Any) -> tuple[str, Any, Path]:
    """``compaction-proxy serve`` at debug level with JSON lines on stderr (to a file)."""
    config = {
        "upstream": {"base_url": f"{sim}/v1"},
        "server": {"admin_key": ADMIN_KEY},
        "models": [{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        "compaction": {"summary_max_tokens": 400},
        "logging": {"format": "json", "level": "debug", **logging_config},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    stderr = tmp_path / "stderr.log"  # and stdout, which the proxy does not write to
    cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path)]
    process, port = start_listening(
        lambda port: [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        stderr,
        "/healthz",
        "the proxy",
    )
    return f"http://127.0.0.1:{port}", process, stderr


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


def test_uvicorn_lines_are_json_when_the_proxy_logs_json(sim_reset: str, tmp_path: Path) -> None:
    """uvicorn's own lines (start-up, shutdown) come out as the proxy's: one JSON object each,
    not uvicorn's text format beside them (a log collector parsing JSON drops those)."""
    config = {"upstream": {"base_url": f"{sim_reset}/v1"}, "logging": {"format": "json"}}
    with serve_process(tmp_path, config) as served:
        served.process.terminate()
        assert served.wait(timeout=30) == 0
    lines = served.log().splitlines()
    assert lines
    assert [line for line in lines if not line.startswith("{")] == []
    parsed = [orjson.loads(line) for line in lines]
    uvicorn = {line["msg"].split(" (")[0] for line in parsed if line["logger"] == "uvicorn.error"}
    assert "Application startup complete." in uvicorn
    assert any(msg.startswith("Uvicorn running on") for msg in uvicorn)
