"""The models listing carries the window the proxy plans with: a client that sizes its
own context from ``GET /v1/models`` (Claude Code's gateway model discovery reads
Anthropic's ``max_input_tokens`` / ``max_tokens``) sees the model's real window behind
the proxy, not its own guess. Over real HTTP: the official SDKs, the proxy under
uvicorn, the simulator upstream listing its models."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anthropic
import httpx
import openai
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.servers import OPEN_CLIENTS, proxy_settings, run_server

LISTED = ("gpt-4o", "claude-sonnet-4-5", "local-coder", "nobody-knows-this-7")


@pytest.fixture
def lister() -> Iterator[str]:
    rules = tuple(ModelRule(match=name) for name in LISTED)
    # Ids only, as OpenAI's listing: every figure in it is the proxy's own.
    config = SimulatorConfig(models=rules, listing="openai")
    with run_server(create_simulator_app(config)) as url:
        yield url


def _settings(sim: str) -> object:
    local = {"match": "local-coder", "context_window": 16_384, "max_output_tokens": 2048}
    return proxy_settings(sim, models=[local])


def test_the_openai_listing_names_each_known_models_window(
    lister: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(_settings(lister))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-list", max_retries=0)
    OPEN_CLIENTS.append(client)
    listed = {m.id: m.model_extra or {} for m in client.models.list()}
    assert set(listed) == set(LISTED)
    assert listed["gpt-4o"]["context_window"] == 128_000  # the registry's
    assert listed["gpt-4o"]["max_input_tokens"] == 128_000
    assert listed["claude-sonnet-4-5"]["max_input_tokens"] == 200_000
    assert listed["local-coder"] == {
        "context_window": 16_384,  # the YAML entry's
        "max_input_tokens": 16_384,
        "max_tokens": 2048,
    }
    # A name nobody knows would get the proxy's default: a guess, so nothing is claimed.
    assert "context_window" not in listed["nobody-knows-this-7"]
    one = httpx.get(f"{url}/v1/models/local-coder", headers={"Authorization": "Bearer sk-list"})
    assert one.status_code in (200, 404)  # the simulator may not serve one model


def test_the_anthropic_sdk_reads_max_input_tokens_from_the_listing(
    lister: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(_settings(lister))
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-list", max_retries=0)
    OPEN_CLIENTS.append(client)
    models = {m.id: m.model_dump() for m in client.models.list()}  # its fields, or extras
    assert models["claude-sonnet-4-5"]["max_input_tokens"] == 200_000
    assert models["claude-sonnet-4-5"]["max_tokens"] > 0


def test_an_upstreams_own_figures_are_kept_and_a_bad_listing_passes_untouched(
    start_proxy: Callable[..., str],
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def own(request: object) -> Response:
        return JSONResponse({"data": [{"id": "gpt-4o", "max_input_tokens": 64_000}]})

    async def broken(request: object) -> Response:
        return Response(b"{not json", media_type="application/json")

    app = Starlette(routes=[Route("/v1/models", own), Route("/v1/models/{name}", broken)])
    with run_server(app) as upstream:
        url = start_proxy(proxy_settings(upstream))
        auth = {"Authorization": "Bearer sk-own"}
        listed = httpx.get(f"{url}/v1/models", headers=auth).json()["data"][0]
        assert listed["max_input_tokens"] == 64_000  # the upstream knows its own models
        assert listed["context_window"] == 128_000  # what it did not say, added
        bad = httpx.get(f"{url}/v1/models/gpt-4o", headers=auth)
        assert (bad.status_code, bad.content) == (200, b"{not json")
