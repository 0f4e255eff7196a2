"""SIGTERM in-process: the signals GracefulServer acts on (proxy.serve.shutdown).

A proxy process draining its requests: tests/e2e/test_shutdown_e2e.py.
"""

from __future__ import annotations

import signal

from proxy.config import ServerSettings
from proxy.serve.server import uvicorn_config
from proxy.serve.shutdown import Drain, GracefulServer
from tests.support.servers import proxy_settings


def test_a_second_signal_ends_the_drain_delay() -> None:
    """First signal: readiness fails, the server keeps accepting; second: it stops now."""
    config = uvicorn_config(proxy_settings("http://127.0.0.1:9"), app=object())
    server = GracefulServer(config, Drain(), ServerSettings(drain_delay_s=30))
    server.handle_exit(signal.SIGTERM, None)
    assert server.drain.draining
    assert not server.should_exit
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit
    assert not server.force_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit  # a further Ctrl-C stops waiting for requests in flight


def test_without_a_drain_delay_the_first_signal_stops_accepting() -> None:
    config = uvicorn_config(proxy_settings("http://127.0.0.1:9"), app=object())
    server = GracefulServer(config, Drain(), ServerSettings(drain_delay_s=0))
    server.handle_exit(signal.SIGTERM, None)
    assert server.drain.draining
    assert server.should_exit
