"""The OpenAI Agents SDK on the Responses API, through the proxy to the simulator."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types.shared import Reasoning

from tests.support.chat import chat_requests, stats
from tests.support.responses import check_items, settings

TURNS = 60


def read_file(step: int) -> str:
    """Read the file for a step of the task."""
    return f"step {step}: " + "line of file content\n" * 60


@pytest.fixture
def statuses() -> Counter[str]:
    return Counter()


async def test_an_agent_runs_60_turns_with_tools_in_an_8k_window_and_recalls_turn_1(
    sim_reset: str, start_proxy: Callable[..., str], statuses: Counter[str]
) -> None:
    # Imported here: the SDK takes ~2 s to import, which the fast tier's collection
    # would pay for nothing.
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    url = start_proxy(settings(sim_reset))
    set_tracing_disabled(True)

    async def count(response: httpx.Response) -> None:
        statuses[response.headers.get("x-compaction-status", "none")] += 1

    http = httpx.AsyncClient(event_hooks={"response": [count]})
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="sk-agent",
        max_retries=0,
        http_client=http,
        default_headers={"X-Session-Id": "agent-60", "X-Sim-Context-Window": "8192"},
    )
    agent = Agent(
        name="worker",
        instructions="You work through the task step by step.",
        model=OpenAIResponsesModel(model="sim-8k", openai_client=client),
        model_settings=ModelSettings(reasoning=Reasoning(effort="low")),
        tools=[function_tool(read_file)],
    )
    run = RunConfig(tracing_disabled=True)
    history: list[Any] = []
    try:
        for turn in range(TURNS):
            fact = " FACT color=blue" if turn == 0 else ""
            text = f"Turn {turn}: read the next file.{fact} CALL 1"
            result = await Runner.run(
                agent, [*history, {"role": "user", "content": text}], run_config=run
            )
            assert result.final_output == "observed 1 tool results"
            history = result.to_input_list()
        recall = [*history, {"role": "user", "content": "RECALL color"}]
        result = await Runner.run(agent, recall, run_config=run)
    finally:
        await client.close()
    assert result.final_output == "color=blue"
    assert statuses["compacted"] >= 2, statuses
    sim = stats(sim_reset)
    assert sim["overflows"] == 0
    assert sim["rejected_structure"] == 0
    sent = chat_requests(sim_reset)
    assert len(sent) == 2 * TURNS + 1
    for request in sent:
        check_items(request["body"]["input"])
