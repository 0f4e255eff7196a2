"""The simulator describes its models as the server it plays does: the window it enforces
in ``GET /v1/models`` (vLLM's ``max_model_len``, OpenRouter's ``context_length``), or, as
llama.cpp, only the trained length there and the served window in ``GET /props``. Over
real HTTP, with the official SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.support.servers import run_server

pytestmark = pytest.mark.e2e


def _config(listing: str) -> SimulatorConfig:
    return SimulatorConfig.model_validate(
        {
            "models": [
                {"match": "sim-6k", "context_window": 6000, "max_output_tokens": 700},
                {"match": "glob-*", "context_window": 9000},
            ],
            "listing": listing,
        }
    )


def _listed(listing: str) -> tuple[dict[str, Any], int, dict[str, Any] | None]:
    with run_server(create_simulator_app(_config(listing))) as url:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)
        try:
            listed = {m.id: m.model_extra or {} for m in sdk.models.list()}
        finally:
            sdk.close()
        props = httpx.get(f"{url}/props", timeout=10)
        return listed, props.status_code, props.json() if props.status_code == 200 else None


def test_a_vllm_listing_names_the_window_each_model_enforces() -> None:
    listed, props, _ = _listed("vllm")
    assert set(listed) == {"sim-6k"}  # globs are rules, not models
    assert listed["sim-6k"]["max_model_len"] == 6000
    assert props == 404  # vLLM has no /props


def test_an_openrouter_listing_names_the_window_and_the_output_limit() -> None:
    listed, _, _ = _listed("openrouter")
    assert listed["sim-6k"]["context_length"] == 6000
    top = {"context_length": 6000, "max_completion_tokens": 700}
    assert listed["sim-6k"]["top_provider"] == top


def test_a_llamacpp_listing_names_the_trained_length_and_props_the_served_window() -> None:
    listed, status, props = _listed("llamacpp")
    assert listed["sim-6k"]["meta"]["n_ctx_train"] > 6000  # not what it serves
    assert "max_model_len" not in listed["sim-6k"]
    assert status == 200
    assert props is not None
    assert props["default_generation_settings"]["n_ctx"] == 6000


def test_an_openai_listing_names_ids_only() -> None:
    listed, props, _ = _listed("openai")
    assert listed["sim-6k"] == {}  # id, object, created and owned_by: the SDK's own fields
    assert props == 404
