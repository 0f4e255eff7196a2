"""A client that always asks ``max_tokens: 32000`` of a model whose output limit is
4,096: the first refusal teaches the proxy the limit, every later request is clamped
before it is sent (``X-Compaction-Output-Clamped``), and nothing says ``trimmed``, since
nothing was. Over real HTTP: the OpenAI SDK, the proxy under uvicorn, the simulator
refusing output budgets above its model's limit as api.openai.com does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai

from tests.support.chat import stats
from tests.support.metrics import exact_metric, metric
from tests.support.servers import OPEN_CLIENTS, proxy_settings

TURNS = 30
ASKED = 32_000
LIMIT = 4096  # the simulator's default model's output limit


def _client(url: str, key: str) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    OPEN_CLIENTS.append(client)
    return client


def _converse(client: openai.OpenAI, turns: int, **extra: Any) -> list[dict[str, str]]:
    """``turns`` turns, each asking ASKED; every answer's headers."""
    messages: list[Any] = [{"role": "system", "content": "You are a coding agent."}]
    seen = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"Step {i}: refactor the parser."})
        raw = client.chat.completions.with_raw_response.create(
            model="sim-coder", messages=messages, max_tokens=ASKED, **extra
        )
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        seen.append(dict(raw.headers))
    return seen


def test_an_output_limit_learned_once_clamps_every_later_turn(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    seen = _converse(_client(url, "sk-agent"), TURNS)
    sim = stats(sim_reset)
    assert sim["rejected_output"] <= 2, sim  # not one a turn
    assert sim["requests"] == TURNS + sim["rejected_output"]
    assert [h["x-compaction-status"] for h in seen] == ["passthrough"] * TURNS
    assert {h.get("x-compaction-output-clamped") for h in seen} == {str(LIMIT)}
    sent = httpx.get(f"{sim_reset}/_sim/requests").json()
    assert sent[-1]["body"]["max_tokens"] == LIMIT  # what the upstream received
    assert exact_metric(url, "compaction_proxy_output_clamped_requests_total") == TURNS - 1
    assert metric(url, "compaction_proxy_learned_output_limits", scope="tenant") == 1


def test_a_stream_is_clamped_too_and_a_budget_within_the_limit_is_not(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    client = _client(url, "sk-stream")
    _converse(client, 1)  # learned
    stream = client.chat.completions.with_raw_response.create(
        model="sim-coder",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=ASKED,
        stream=True,
    )
    assert stream.headers["x-compaction-output-clamped"] == str(LIMIT)
    assert "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    small = client.chat.completions.with_raw_response.create(
        model="sim-coder", messages=[{"role": "user", "content": "hi"}], max_tokens=100
    )
    assert "x-compaction-output-clamped" not in small.headers
    assert stats(sim_reset)["rejected_output"] == 1


def test_claude_codes_32000_against_a_smaller_limit_is_learned_on_messages_too(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Claude Code asks 32,000 without CLAUDE_CODE_MAX_OUTPUT_TOKENS (streamed, as it
    does); Anthropic refuses a budget above the model's limit as "max_tokens: 32000 >
    4096, which is the maximum allowed number of output tokens for ..."."""
    import anthropic

    url = start_proxy(proxy_settings(sim_reset))
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-ceiling", max_retries=0)
    OPEN_CLIENTS.append(client)
    messages: list[Any] = []
    statuses, clamped = [], []
    for i in range(10):
        messages.append({"role": "user", "content": f"Step {i}: fix the build."})
        raw = client.messages.with_raw_response.create(
            model="sim-claude", max_tokens=ASKED, messages=messages, stream=True
        )
        text = "".join(
            e.delta.text  # type: ignore[union-attr]
            for e in raw.parse()
            if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )
        messages.append({"role": "assistant", "content": text})
        statuses.append(raw.headers["x-compaction-status"])
        clamped.append(raw.headers.get("x-compaction-output-clamped"))
    assert stats(sim_reset)["rejected_output"] == 1
    assert statuses == ["passthrough"] * 10
    assert clamped == [str(LIMIT)] * 10
