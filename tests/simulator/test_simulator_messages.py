"""The simulator's ``/v1/messages``, driven by the official ``anthropic`` SDK: Anthropic's
validation and error bodies, streams, usage with prompt caching, the reply rules."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from proxy.simulator.anthropic_check import sign
from tests.support.servers import OPEN_CLIENTS

TOOLS = [{"name": "read_file", "description": "Read", "input_schema": {"type": "object"}}]


def client(url: str, **headers: str) -> anthropic.Anthropic:
    sdk = anthropic.Anthropic(
        base_url=url, api_key="sk-ant-test", max_retries=0, default_headers=headers
    )
    OPEN_CLIENTS.append(sdk)
    return sdk


def post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json=body, headers=headers)


def rejected(url: str, body: dict[str, Any]) -> str:
    answer = post(url, {"model": "sim", "max_tokens": 100, **body})
    assert answer.status_code == 400, answer.text
    payload = answer.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "invalid_request_error"
    return str(payload["error"]["message"])


def test_recall_create_and_stream(simulator: str) -> None:
    sdk = client(simulator)
    messages: list[Any] = [
        {"role": "user", "content": "FACT color=teal"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": [{"type": "text", "text": "RECALL color"}]},
    ]
    answer = sdk.messages.create(model="sim", max_tokens=100, system="Be brief.", messages=messages)
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "color=teal"
    assert answer.stop_reason == "end_turn"
    assert answer.usage.input_tokens > 0
    assert answer.usage.output_tokens > 0
    with sdk.messages.stream(model="sim", max_tokens=100, messages=messages) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == "color=teal"  # type: ignore[union-attr]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds
    assert "message_delta" in kinds


def test_tools_and_thinking_round_trip(simulator: str) -> None:
    sdk = client(simulator)
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    messages: list[Any] = [{"role": "user", "content": "CALL 2"}]
    first = sdk.messages.create(
        model="sim", max_tokens=2000, messages=messages, tools=TOOLS, thinking=thinking
    )
    assert [b.type for b in first.content] == ["thinking", "tool_use", "tool_use"]
    assert first.stop_reason == "tool_use"
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    results = [
        {"type": "tool_result", "tool_use_id": b.id, "content": "done"}
        for b in first.content
        if b.type == "tool_use"
    ]
    messages.append({"role": "user", "content": results})
    with sdk.messages.stream(
        model="sim", max_tokens=2000, messages=messages, tools=TOOLS, thinking=thinking
    ) as stream:
        final = stream.get_final_message()
    assert final.content[-1].text == "observed 2 tool results"  # type: ignore[union-attr]
    # A thinking block altered there is rejected; so is one stripped.
    altered = [dict(b) for b in messages[1]["content"]]
    altered[0] = {**altered[0], "thinking": altered[0]["thinking"] + " "}
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        sdk.messages.create(
            model="sim",
            max_tokens=2000,
            messages=[messages[0], {"role": "assistant", "content": altered}, messages[2]],
            tools=TOOLS,
            thinking=thinking,
        )
    stripped = [b for b in messages[1]["content"] if b["type"] != "thinking"]
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
        sdk.messages.create(
            model="sim",
            max_tokens=2000,
            messages=[messages[0], {"role": "assistant", "content": stripped}, messages[2]],
            tools=TOOLS,
            thinking=thinking,
        )


def test_validation(simulator: str) -> None:
    answer = post(simulator, {"model": "sim", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "max_tokens: Field required"
    assert "first message must use" in rejected(
        simulator, {"messages": [{"role": "assistant", "content": "hi"}]}
    )
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert "roles must alternate" in rejected(simulator, {"messages": two_users})
    use = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}
    unanswered = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": "b"},
    ]
    assert "without `tool_result` blocks" in rejected(simulator, {"messages": unanswered})
    orphan = [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]
    orphaned = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": orphan},
    ]
    assert "unexpected `tool_use_id`" in rejected(simulator, {"messages": orphaned})
    forged = [{"type": "thinking", "thinking": "hmm", "signature": sign("hmm") + "0"}]
    assert "Invalid `signature`" in rejected(
        simulator,
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": forged},
                {"role": "user", "content": "b"},
            ]
        },
    )


def test_at_most_four_cache_breakpoints(simulator: str) -> None:
    marked = {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
    system = [marked, marked]
    three = [{"role": "user", "content": [marked, marked, marked]}]
    assert "A maximum of 4 blocks with cache_control" in rejected(
        simulator, {"system": system, "messages": three}
    )
    two = [{"role": "user", "content": [marked, marked]}]
    ok = post(simulator, {"model": "sim", "max_tokens": 10, "system": system, "messages": two})
    assert ok.status_code == 200, ok.text


def test_overflow_answers(simulator: str) -> None:
    big = {"role": "user", "content": "word " * 400}
    small = {"model": "sim", "messages": [big], "max_tokens": 100}
    too_long = post(simulator, small, **{"X-Sim-Context-Window": "300"})
    assert too_long.status_code == 400
    message = too_long.json()["error"]["message"]
    assert message.startswith("prompt is too long: ")
    assert message.endswith(" tokens > 300 maximum")
    budget = post(simulator, {**small, "max_tokens": 400}, **{"X-Sim-Context-Window": "700"})
    assert budget.status_code == 400
    text = budget.json()["error"]["message"]
    assert text.startswith("input length and `max_tokens` exceed context limit: ")
    assert text.endswith(" + 400 > 700, decrease input length or `max_tokens` and try again")
    streamed = post(
        simulator,
        {**small, "stream": True},
        **{"X-Sim-Context-Window": "300", "X-Sim-Errors-In-Stream": "1"},
    )
    assert streamed.status_code == 200
    assert streamed.text.startswith("event: message_start\n")
    assert "event: ping\n" in streamed.text
    assert "event: error\ndata: " in streamed.text
    assert "prompt is too long" in streamed.text


def test_prompt_cache_usage(simulator: str) -> None:
    system = [
        {"type": "text", "text": "cached rules " * 200, "cache_control": {"type": "ephemeral"}}
    ]
    body = {"model": "sim", "max_tokens": 50, "system": system}
    first = post(simulator, {**body, "messages": [{"role": "user", "content": "one"}]}).json()
    second = post(simulator, {**body, "messages": [{"role": "user", "content": "two"}]}).json()
    assert first["usage"]["cache_creation_input_tokens"] > 0
    assert (
        second["usage"]["cache_read_input_tokens"] == first["usage"]["cache_creation_input_tokens"]
    )
    counted = httpx.post(
        f"{simulator}/v1/messages/count_tokens",
        json={"model": "sim", "messages": [{"role": "user", "content": "one"}]},
    )
    assert counted.status_code == 200
    assert counted.json()["input_tokens"] > 0


@pytest.mark.parametrize(
    "beta", ["mid-conversation-system-2025-10-01", "mid-conversation-tool-changes-2026-07-01"]
)
def test_a_system_message_between_turns_needs_a_beta_that_allows_it(
    simulator: str, beta: str
) -> None:
    """Claude Code 2.1.332 sends its mid-conversation system message under the newer
    ``mid-conversation-tool-changes`` beta; without a beta the API refuses the role."""
    late = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "tools changed"},
        {"role": "user", "content": "c"},
    ]
    body = {"model": "sim", "max_tokens": 20, "messages": late}
    assert post(simulator, body).status_code == 400
    answer = post(simulator, body, **{"anthropic-beta": f"prompt-caching-2024-07-31,{beta}"})
    assert answer.status_code == 200, answer.text
