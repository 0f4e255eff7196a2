"""Running the app under uvicorn.

``serve_process(settings)`` is one serving process (``compaction-proxy serve`` alone, or
each of its workers: proxy.serve.workers); it stops gracefully on SIGTERM
(proxy.serve.shutdown). ``uvicorn_config(settings)`` is what each one runs and what the tests serve:
uvloop when installed, no access log, and the HTTP protocol of proxy.serve.limits,
which bounds slow and hostile clients.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
from typing import Any

import uvicorn

from proxy.config import Settings
from proxy.observe import logs
from proxy.serve.limits import limited_protocol
from proxy.serve.shutdown import Drain, GracefulServer

log = logging.getLogger("proxy.server")


def uvicorn_config(
    settings: Settings,
    app: Any = None,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str | None = None,
) -> uvicorn.Config:
    """The uvicorn configuration the proxy runs with; ``app`` defaults to ``create_app``."""
    if app is None:
        from proxy.app import create_app

        app = create_app(settings)
    server = settings.server
    options: dict[str, Any] = {}
    if logs.configured():
        # uvicorn's own lines (uvicorn.error) reach the proxy's handler, in its format
        # (JSON or text), instead of uvicorn's handlers and text format beside them.
        options["log_config"] = None
    try:
        options["http"] = limited_protocol(server)
    except ImportError:  # pragma: no cover - uvicorn[standard] installs httptools
        log.warning("httptools is not installed: header/body timeouts are not enforced")
        options["http"] = "h11"
        options["h11_max_incomplete_event_size"] = server.max_header_bytes
    try:
        import uvloop  # noqa: F401

        options["loop"] = "uvloop"
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it
        options["loop"] = "asyncio"
    return uvicorn.Config(
        app,
        host=server.host if host is None else host,
        port=server.port if port is None else port,
        log_level=server.log_level if log_level is None else log_level,
        # Never an access log: it costs throughput and would log every request's path.
        access_log=False,
        # Nothing reads the client address or scheme a request came with (scope "client",
        # "scheme"): no X-Forwarded-* rewriting of them, a frame and a scan of the headers
        # on every request from 127.0.0.1 (issue 27). The headers themselves still go up.
        proxy_headers=False,
        lifespan="on",
        ws="none",
        timeout_keep_alive=server.keepalive_timeout_s,
        # Typed int, but only ever handed to asyncio.wait_for (GracefulServer has its own).
        timeout_graceful_shutdown=server.shutdown_timeout_s,  # type: ignore[arg-type]
        **options,
    )


# Net new container objects between young-generation collections (CPython's default: 700).
GC_THRESHOLD = 10_000


def serve_process(
    settings: Settings, sockets: list[Any] | None = None, parent_pid: int | None = None
) -> None:
    """One serving process: on ``settings.server``'s address, or on ``sockets`` already
    bound (a worker, whose supervisor is ``parent_pid``)."""
    from proxy.app import create_app

    drain = Drain()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the app reloads on it (reload.py)
    config = uvicorn_config(settings, create_app(settings, drain))
    # What start-up built (modules, settings, tables) lives as long as the process:
    # out of the collector's sight, a full collection no longer walks it all (a pause
    # every request in flight waited out; bench/README.md has the figure).
    gc.freeze()
    # A request leaves no reference cycles behind (tests/upstream/test_disconnect.py holds the one
    # that did), so collections find next to nothing, yet at the default threshold (700
    # net new objects) the requests in flight alone set one off every few requests, and
    # a full one often, the frozen start-up excluded from the sizes that pace them: the
    # largest cost the floor does not pay, and next to none at 10,000 (bench/README.md).
    gc.set_threshold(GC_THRESHOLD)
    GracefulServer(config, drain, settings.server, parent_pid).run(sockets=sockets)
