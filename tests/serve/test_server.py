"""The uvicorn configuration the proxy runs with (proxy.serve.server)."""

from __future__ import annotations

from proxy.app import create_app
from proxy.serve.server import uvicorn_config
from tests.support.servers import proxy_settings


def test_uvicorn_serves_the_app_itself() -> None:
    """No middleware of uvicorn's around it: in particular no X-Forwarded-* rewriting of
    the scope's client and scheme, which nothing in the proxy reads (issue 27: a frame
    and a scan of the headers a request)."""
    settings = proxy_settings("http://127.0.0.1:9")
    app = create_app(settings)
    config = uvicorn_config(settings, app, log_level="warning")
    config.load()
    assert config.loaded_app is app
