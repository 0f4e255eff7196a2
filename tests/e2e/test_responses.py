"""The Responses API end to end: real proxy, the openai SDK's ``client.responses``, the
simulator's ``/v1/responses`` as upstream."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.core.wording import ACKNOWLEDGEMENT, CONTINUE, HANDOFF_INTRO
from tests.support.chat import chat_requests, stats
from tests.support.responses import WINDOW, check_items, settings
from tests.support.servers import OPEN_CLIENTS

TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
    }
]
OUTPUT = "line of file content\n" * 40


@pytest.fixture
def proxy8k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return str(start_proxy(settings(sim_reset)))


@dataclass
class Agent:
    """A stateless Responses client (``store: false``): it keeps every item itself."""

    base: str
    session: str | None = "agent"
    stream: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # more request fields
    items: list[dict[str, Any]] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    last: httpx.Headers | None = None

    def __post_init__(self) -> None:
        self.client = openai.OpenAI(base_url=f"{self.base}/v1", api_key="sk-a", max_retries=0)
        OPEN_CLIENTS.append(self.client)

    def send(self, **extra: Any) -> Any:
        headers = {"X-Sim-Context-Window": str(WINDOW), **self.headers}
        if self.session:
            headers["X-Session-Id"] = self.session
        kwargs: dict[str, Any] = {
            "model": "sim-8k",
            "input": self.items,
            "instructions": "You are a careful agent.",
            "tools": TOOLS,
            "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "extra_headers": headers,
            **self.extra,
            **extra,
        }
        if self.stream:
            with self.client.responses.with_streaming_response.create(stream=True, **kwargs) as raw:
                self.last = raw.headers
                events = [
                    orjson.loads(line[6:]) for line in raw.iter_lines() if line[:6] == "data: "
                ]
            done = events[-1]
            assert done["type"] == "response.completed", done
            output = done["response"]["output"]
        else:
            raw = self.client.responses.with_raw_response.create(**kwargs)
            self.last = raw.headers
            output = [item.model_dump(exclude_none=True) for item in raw.parse().output]
        self.statuses[self.last["x-compaction-status"]] += 1
        return output

    def turn(self, text: str) -> str:
        """One user turn: the model calls tools until it answers in text."""
        self.items.append({"role": "user", "content": text})
        for _ in range(5):
            output = self.send()
            self.items += output
            calls = [item for item in output if item["type"] == "function_call"]
            for call in calls:
                output_item = {"type": "function_call_output", "call_id": call["call_id"]}
                self.items.append({**output_item, "output": f"{call['call_id']}: {OUTPUT}"})
            if not calls:
                return "".join(
                    part["text"]
                    for item in output
                    if item["type"] == "message"
                    for part in item["content"]
                )
        raise AssertionError("the model kept calling tools")


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_agent_loop_compacts_and_recalls_a_fact(
    proxy8k: str, sim_reset: str, stream: bool
) -> None:
    agent = Agent(proxy8k, stream=stream)
    agent.turn("Start the task. FACT color=blue CALL 1")
    for turn in range(30):
        agent.turn(f"Step {turn}: keep going. CALL 2")
    assert agent.turn("RECALL color") == "color=blue"
    assert agent.statuses["compacted"] >= 2
    sim = stats(sim_reset)
    assert sim["rejected_structure"] == 0
    assert sim["overflows"] == 0
    client_items = {orjson.dumps(item) for item in agent.items}
    handoffs = 0
    for request in chat_requests(sim_reset):
        body = request["body"]
        assert body["instructions"] == "You are a careful agent."
        check_items(body["input"])
        for item in body["input"]:
            if orjson.dumps(item) in client_items:
                continue  # the client's own item, byte for byte (encrypted reasoning too)
            if item.get("type") == "function_call_output":
                assert item["output"].startswith("[compaction-proxy: output of tool 'read_file'")
                continue
            assert set(item) == {"type", "role", "content"}, item
            text = item["content"]
            proxy_written = text.startswith((HANDOFF_INTRO, "Verbatim excerpts"))
            assert proxy_written or text in (ACKNOWLEDGEMENT, CONTINUE)
            handoffs += text.startswith(HANDOFF_INTRO)
    assert handoffs > 0


def test_encrypted_reasoning_reaches_the_upstream_byte_identical(
    proxy8k: str, sim_reset: str
) -> None:
    agent = Agent(proxy8k, session="reasoning")
    for turn in range(24):
        agent.turn(f"Step {turn}: keep going. CALL 2")
    assert agent.statuses["compacted"] >= 1
    issued = {
        item["id"]: item["encrypted_content"]
        for item in agent.items
        if item.get("type") == "reasoning"
    }
    kept = 0
    for request in chat_requests(sim_reset):
        for item in request["body"]["input"]:
            if item.get("type") == "reasoning":
                assert item["encrypted_content"] == issued[item["id"]]
                kept += 1
    assert kept > 0
    assert stats(sim_reset)["rejected_structure"] == 0


def test_a_chained_request_is_forwarded_untouched(proxy8k: str, sim_reset: str) -> None:
    client = openai.OpenAI(base_url=f"{proxy8k}/v1", api_key="sk-a", max_retries=0)
    OPEN_CLIENTS.append(client)
    first = client.responses.create(model="sim-8k", input="FACT pet=cat")
    body = {"model": "sim-8k", "previous_response_id": first.id, "input": "RECALL pet"}
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)  # bytes no re-encoding would keep
    answer = httpx.post(
        f"{proxy8k}/v1/responses",
        content=raw,
        headers={"Authorization": "Bearer sk-a", "Content-Type": "application/json"},
    )
    assert answer.status_code == 200
    assert answer.headers["x-compaction-status"] == "bypassed"
    assert answer.json()["output"][0]["content"][0]["text"] == "pet=cat"
    assert raw in httpx.get(f"{sim_reset}/_sim/requests").content


def test_compaction_off_is_bypassed(proxy8k: str, sim_reset: str) -> None:
    agent = Agent(proxy8k, headers={"X-Compaction": "off"})
    agent.turn("hello")
    assert agent.statuses == Counter({"bypassed": 1})


def long_input() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "FACT city=oslo"}]
    for i in range(16):
        items.append({"role": "assistant", "content": f"turn {i} " + "word " * 400})
        items.append({"role": "user", "content": f"turn {i} " + "word " * 400})
    return [*items, {"role": "user", "content": "RECALL city"}]


@pytest.mark.parametrize("stream", [False, True])
def test_an_overflow_is_recovered_once(
    sim_reset: str, start_proxy: Callable[..., str], stream: bool
) -> None:
    url = start_proxy(settings(sim_reset, window=32768))
    sim = {"X-Sim-Context-Window": "6144", "X-Sim-Errors-In-Stream": "1"}
    body = {"model": "sim-big", "input": long_input(), "stream": stream}
    direct = httpx.post(f"{sim_reset}/v1/responses", json=body, headers=sim)
    if stream:  # the simulator fails the stream after its lifecycle events
        assert direct.status_code == 200
        assert "response.failed" in direct.text
    else:
        assert direct.status_code == 400
        assert direct.json()["error"]["code"] == "context_length_exceeded"
    httpx.delete(f"{sim_reset}/_sim/requests")

    answer = httpx.post(
        f"{url}/v1/responses", json=body, headers={"Authorization": "Bearer sk-a", **sim}
    )
    assert answer.status_code == 200
    assert answer.headers["x-compaction-status"] in ("trimmed", "compacted")
    if stream:
        assert "response.failed" not in answer.text
        assert "event: response.completed" in answer.text
        assert answer.text.startswith("event: response.created")
    else:
        assert answer.json()["output"][0]["content"][0]["text"] == "city=oslo"
    sent = chat_requests(sim_reset)
    assert len(sent) == 2  # the attempt that failed, then exactly one retry
    assert len(sent[1]["body"]["input"]) < len(long_input())


def test_a_too_large_max_output_tokens_is_lowered_once(proxy8k: str, sim_reset: str) -> None:
    body = {"model": "sim-8k", "input": "hello", "max_output_tokens": 100_000}
    headers = {"Authorization": "Bearer sk-a", "X-Sim-Max-Output-Tokens": "200"}
    answer = httpx.post(f"{proxy8k}/v1/responses", json=body, headers=headers)
    assert answer.status_code == 200
    sent = chat_requests(sim_reset)
    assert [r["body"]["max_output_tokens"] for r in sent] == [100_000, 200]


def test_prompt_cache_key_names_the_session_without_a_header(proxy8k: str, sim_reset: str) -> None:
    agent = Agent(proxy8k, session=None, extra={"prompt_cache_key": "pck-7"})
    agent.turn("FACT color=green")
    for turn in range(16):
        agent.turn(f"Step {turn}. CALL 2")
    assert agent.statuses["compacted"] >= 1
    session = httpx.get(f"{proxy8k}/sessions/pck-7", headers={"Authorization": "Bearer sk-a"})
    assert session.status_code == 200
    assert "color=green" in session.json()["summary"]
