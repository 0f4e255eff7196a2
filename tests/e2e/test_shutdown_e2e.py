"""SIGTERM end to end: readiness fails, new connections stop, requests in flight finish or
are cut at the deadline, the process exits 0 (proxy.serve.shutdown). The proxy runs as
its own process (`python -m proxy serve`) in front of the simulator, which streams
slowly. The signal handling in-process: tests/serve/test_shutdown.py.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.serve.server import uvicorn_config
from proxy.serve.shutdown import Drain, GracefulServer
from tests.support.processes import SlowStream, refused, serve_process, wait_until_refused
from tests.support.servers import proxy_settings

# One streamed answer from the simulator: 10 chunks, so about 10 x the chunk delay.
_CHUNKS = 10
# The drain delay: long enough that "readiness fails first" is seen within it on a busy
# machine, and that a stream of _CHUNKS chunks a quarter of it apart outlasts it.
DRAIN_S = 4


def _config(simulator: str, **server: float) -> dict[str, object]:
    return {"upstream": {"base_url": f"{simulator}/v1"}, "server": server}


def _complete(stream: SlowStream) -> None:
    assert stream.error is None, stream.error
    assert stream.events[-1] == "data: [DONE]"
    last = orjson.loads(stream.events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "stop"


@pytest.mark.e2e
def test_sigterm_lets_a_slow_stream_finish_and_refuses_new_connections(
    simulator: str, tmp_path: Path
) -> None:
    config = _config(simulator, shutdown_timeout_s=20, drain_delay_s=0)
    with serve_process(tmp_path, config) as served:
        stream = SlowStream(served.url, chunk_delay_ms=300).start()
        served.process.send_signal(signal.SIGTERM)
        wait_until_refused(served.url, timeout=4)
        assert stream.running(), "refused only once the stream had ended"
        stream.join(timeout=_CHUNKS * 0.3 + 10)
        _complete(stream)
        assert served.wait(timeout=10) == 0
        log = served.log()
    assert "waiting up to 20.0 s for 1 request(s) in flight" in log
    assert "Traceback" not in log


@pytest.mark.e2e
def test_readyz_fails_at_once_while_connections_are_accepted_for_the_drain_delay(
    simulator: str, tmp_path: Path
) -> None:
    config = _config(simulator, shutdown_timeout_s=20, drain_delay_s=DRAIN_S)
    with serve_process(tmp_path, config) as served:
        assert httpx.get(f"{served.url}/readyz").status_code == 200
        stream = SlowStream(served.url, chunk_delay_ms=DRAIN_S * 1000 // 4).start()
        signalled = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        # Readiness fails first (a signal is handled on a tick; a busy machine's delay)...
        deadline = signalled + DRAIN_S
        while (ready := httpx.get(f"{served.url}/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "/readyz still answers 200"
            time.sleep(0.02)
        assert ready.status_code == 503
        assert ready.json() == {"ready": False, "draining": True}
        # ...while new connections are still served, until the drain delay has passed.
        assert httpx.get(f"{served.url}/healthz").status_code == 200
        wait_until_refused(served.url, timeout=DRAIN_S + 30)
        assert time.monotonic() - signalled >= DRAIN_S
        assert stream.running()
        stream.join(timeout=_CHUNKS * DRAIN_S / 4 + 30)
        _complete(stream)
        assert served.wait(timeout=10) == 0


@pytest.mark.e2e
def test_a_stream_longer_than_the_grace_period_is_cut_and_the_process_exits(
    simulator: str, tmp_path: Path
) -> None:
    config = _config(simulator, shutdown_timeout_s=1, drain_delay_s=0)
    with serve_process(tmp_path, config) as served:
        # 10 chunks 3 s apart: a proxy that waited for the stream would exit after 30 s.
        stream = SlowStream(served.url, chunk_delay_ms=3000).start()
        signalled = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.wait(timeout=40) == 0
        # The deadline (1 s), the cancelled request's clean-up (at most 2 s), the store and
        # the client closing, the coverage data written; a loaded machine's slack.
        assert time.monotonic() - signalled < 20
        stream.join(timeout=5)
        log = served.log()
    assert isinstance(stream.error, httpx.RemoteProtocolError)  # the body ended unfinished
    assert "data: [DONE]" not in stream.events
    assert "shutdown_timeout_s (1.0 s) reached: ending 1 request(s) still running" in log
    # One warning, not uvicorn's traceback per cancelled request.
    assert "Traceback" not in log
    assert "Exception in ASGI application" not in log


@pytest.mark.e2e
def test_requests_cut_at_the_deadline_are_counted(simulator: str) -> None:
    """The same cut in process, where the metrics outlive the server."""
    settings = proxy_settings(simulator, server={"shutdown_timeout_s": 0.5})
    drain = Drain()
    config = uvicorn_config(settings, create_app(settings, drain), port=0, log_level="error")
    server = GracefulServer(config, drain, settings.server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "server did not start"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    streams = [SlowStream(url, chunk_delay_ms=1000).start() for _ in range(2)]
    server.handle_exit(signal.SIGTERM, None)
    thread.join(timeout=10)
    assert not thread.is_alive()
    for stream in streams:
        stream.join(timeout=5)
        assert isinstance(stream.error, httpx.RemoteProtocolError)
    assert drain.metrics is not None
    cut = drain.metrics.registry.get_sample_value("compaction_proxy_requests_cut_at_shutdown_total")
    assert cut == 2
    assert refused(url)
