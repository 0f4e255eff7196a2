"""With no ``models:`` at all, a model people run gets its real window from the model
registry the proxy ships (X-Context-Window, and X-Context-Window-Source says so); a name
nobody knows gets ``default_model``'s, and is counted. Over real HTTP: the official SDK,
the proxy under uvicorn, the simulator upstream."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.metrics import exact_metric, metric
from tests.support.servers import OPEN_CLIENTS, proxy_settings


def _ask(client: openai.OpenAI, model: str) -> tuple[int, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=16
    )
    return int(raw.headers["x-context-window"]), raw.headers["x-context-window-source"]


@pytest.mark.parametrize(
    ("model", "window"),
    [("gpt-4o", 128_000), ("claude-sonnet-4-5", 200_000), ("openai/gpt-4.1", 1_047_576)],
)
def test_a_known_model_gets_its_window_from_the_registry_without_config(
    sim_reset: str, start_proxy: Callable[..., str], model: str, window: int
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-registry", max_retries=0)
    OPEN_CLIENTS.append(client)
    assert _ask(client, model) == (window, "registry")
    assert metric(url, "compaction_proxy_models_resolved", source="registry") == 1


def test_an_unknown_model_gets_the_default_window_and_is_counted(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-registry", max_retries=0)
    OPEN_CLIENTS.append(client)
    for _ in range(3):
        assert _ask(client, "nobody-knows-this-model-7") == (32_768, "default")
    assert exact_metric(url, "compaction_proxy_default_model_requests_total") == 3
    # Resolved once, then from the table's cache.
    assert metric(url, "compaction_proxy_models_resolved", source="default") == 1


def test_a_models_entry_overrides_the_registry(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    models = [{"match": "gpt-4o", "context_window": 64_000, "max_output_tokens": 4096}]
    url = start_proxy(proxy_settings(sim_reset, models=models))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-registry", max_retries=0)
    OPEN_CLIENTS.append(client)
    assert _ask(client, "gpt-4o") == (64_000, "config")
    assert _ask(client, "gpt-4o-mini") == (128_000, "registry")


def test_the_sessions_api_says_where_the_models_window_came_from(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-registry", max_retries=0)
    OPEN_CLIENTS.append(client)
    client.chat.completions.create(
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"X-Session-Id": "registry-session"},
    )
    auth = {"Authorization": "Bearer sk-registry"}
    deadline = time.monotonic() + 10  # the sighting is noted once the answer is out
    seen = httpx.get(f"{url}/sessions/registry-session", headers=auth)
    while seen.status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = httpx.get(f"{url}/sessions/registry-session", headers=auth)
    info = seen.json()
    assert (info["model"], info["context_window"], info["window_source"]) == (
        "claude-sonnet-4-5",
        200_000,
        "registry",
    )
