"""The composition root: build_services opens, aclose closes, a failed build leaks nothing."""

from __future__ import annotations

import asyncio
import gc
import io
import logging
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.config import LoggingSettings, Settings
from proxy.errors import ConfigError
from proxy.observe import logs
from proxy.observe.logs import configure_logging, request_line_writer
from proxy.services import build_services, load_models


def _open_sessions() -> set[int]:
    """Identities of the aiohttp sessions alive in this process and not yet closed."""
    return {
        id(o) for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed
    }


async def test_build_services_opens_one_upstream_client_and_aclose_closes_it() -> None:
    before = _open_sessions()
    services = await build_services(Settings())
    assert len(_open_sessions() - before) == 1
    assert services.loop is asyncio.get_running_loop()  # the one a request's task runs on
    await services.aclose()
    assert not _open_sessions() - before


async def test_a_store_that_fails_to_build_closes_the_upstream_client() -> None:
    # Past validation (as a model_copy is): the store's own constructor refuses the key.
    store = Settings().store.model_copy(
        update={"url": "redis://127.0.0.1:9/0", "encryption_keys": [SecretStr("not-a-key")]}
    )
    broken = Settings().model_copy(update={"store": store})
    before = _open_sessions()
    with pytest.raises(ConfigError, match="encryption_keys"):
        await build_services(broken)
    assert not _open_sessions() - before


async def test_each_build_has_metrics_of_its_own() -> None:
    first, second = await build_services(Settings()), await build_services(Settings())
    try:
        assert first.metrics.registry is not second.metrics.registry
        first.metrics.requests.labels(status="compacted").inc()
        wanted = ("compaction_proxy_chat_requests_total", {"status": "compacted"})
        assert first.metrics.registry.get_sample_value(*wanted) == 1
        assert second.metrics.registry.get_sample_value(*wanted) == 0
    finally:
        await first.aclose()
        await second.aclose()


def _unreadable(n: int) -> dict[str, Any]:
    raise ValueError(n)


async def test_the_apps_metrics_count_the_request_lines_the_log_writer_could_not_format() -> None:
    """Logging configured first (as ``__main__`` does), then the app: its /metrics counts
    each request line written as an error line instead (tests/observe/test_access_line.py
    has the rest: either order, several workers)."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("proxy").level)
    configure_logging(LoggingSettings(), stream=io.StringIO())
    services = await build_services(Settings())
    try:
        name = "compaction_proxy_request_lines_unformatted_total"
        assert services.metrics.registry.get_sample_value(name) == 0
        write = request_line_writer()
        assert write is not None
        for n in range(2):
            write(f"r-{n}", _unreadable, n)
        logs._stop_writer()
        scraped = services.metrics.exposition().decode()
        assert f"{name} 2.0" in scraped.splitlines()
    finally:
        await services.aclose()
        logs._stop_writer()
        logs.count_unformatted_with(None)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("proxy").setLevel(saved[2])


async def test_load_models_loads_one_encoder_per_tokenizer_the_table_names() -> None:
    models, encoders = await load_models(Settings())
    assert set(encoders) == set(models.tokenizers())


def test_the_lifespan_serves_the_built_services_to_handlers() -> None:
    with TestClient(create_app(Settings())) as client:
        assert client.get("/readyz").json() == {"ready": True, "store": "ok"}
        assert client.get("/metrics").status_code == 200


def test_scoped_routes_refuse_a_request_without_a_credential() -> None:
    settings = Settings(upstream={"api_key": "sk-upstream"})
    with TestClient(create_app(settings)) as client:
        assert client.get("/sessions/abc").status_code == 401
        assert client.get("/healthz").status_code == 200
