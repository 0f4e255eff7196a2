"""Issue 24 item 2: Responses ``item_reference`` inputs, end to end. A client that stores
its answers upstream (``store: true``, as the Vercel AI SDK's default Responses provider)
sends its own turns inline and each earlier answer back by id; the simulator resolves
the ids from the responses it stored, as api.openai.com does. The proxy must count and
summarize those answers as what they are, and send them on as references."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.support.chat import stats, upstream_requests
from tests.support.servers import RedisServer, proxy_settings, run_server

WINDOW = 4096
# Answers of some 150 words: an answer's text, not its reference's JSON, must dominate.
REPLY_TOKENS = 150


def settings(sim: str, store: str = "memory://") -> Any:
    return proxy_settings(
        sim,
        models=[{"match": "sim-*", "context_window": WINDOW, "max_output_tokens": 256}],
        # A transcript, which quotes the referenced answers' text: asked as the turn's own
        # request (summary_prompt: cached), they go as the references the upstream resolves.
        compaction={
            "summary_max_tokens": 400,
            "precompact_ratio": None,
            "summary_prompt": "transcript",
        },
        store={"url": store},
    )


@pytest.fixture(scope="module")
def talkative() -> Iterator[str]:
    with run_server(create_simulator_app(SimulatorConfig(reply_tokens=REPLY_TOKENS))) as url:
        yield url


@pytest.fixture
def sim(talkative: str) -> str:
    httpx.delete(f"{talkative}/_sim/requests")
    return talkative


@dataclass
class Referencing:
    """A ``store: true`` client: its user turns inline, each earlier output by reference."""

    base: str
    stream: bool = False
    session: str = "referencing"
    headers: dict[str, str] = field(default_factory=dict)  # more request headers
    items: list[dict[str, Any]] = field(default_factory=list)
    whole: list[dict[str, Any]] = field(default_factory=list)  # the same, every item whole
    turns: list[tuple[httpx.Headers, int]] = field(default_factory=list)  # headers, usage

    def turn(self, text: str) -> str:
        user = {"role": "user", "content": text}
        self.items.append(user)
        self.whole.append(user)
        response = self._send({"model": "sim-4k", "input": self.items, "stream": self.stream})
        output = response["output"]
        self.items += [{"type": "item_reference", "id": item["id"]} for item in output]
        self.whole += output
        return "".join(part["text"] for item in output for part in item.get("content", []))

    def _send(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {
            "Authorization": "Bearer sk-referencing",
            "X-Session-Id": self.session,
            "X-Sim-Context-Window": str(WINDOW),
            **self.headers,
        }
        body = {"instructions": "You are a careful assistant.", **body}
        answer = httpx.post(f"{self.base}/v1/responses", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        if self.stream:
            events = [
                orjson.loads(line[6:]) for line in answer.text.splitlines() if line[:6] == "data: "
            ]
            assert events[-1]["type"] == "response.completed"
            response: dict[str, Any] = events[-1]["response"]
        else:
            response = answer.json()
        self.turns.append((answer.headers, response["usage"]["input_tokens"]))
        return response


def _summarizer_prompts(sim: str) -> str:
    texts = []
    for request in upstream_requests(sim):
        if request["headers"].get("x-compaction-purpose") == "summarize":
            # A transcript's messages, or the Responses request itself (summary_prompt: cached)
            body = request["body"]
            texts += [str(m.get("content")) for m in body.get("messages") or body["input"]]
    return "\n".join(texts)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("redis", [False, pytest.param(True, marks=pytest.mark.redis)])
def test_referenced_answers_are_counted_and_summarized_as_their_text(
    sim: str,
    start_proxy: Callable[..., str],
    request: pytest.FixtureRequest,
    stream: bool,
    redis: bool,
) -> None:
    url = request.getfixturevalue("redis_server").url if redis else "memory://"
    proxy = start_proxy(settings(sim, url))
    client = Referencing(proxy, stream=stream)
    client.turn("Start the task. FACT color=blue")
    for step in range(24):
        client.turn(f"Step {step}: go on.")
    assert client.turn("RECALL color") == "color=blue"

    statuses = [headers["x-compaction-status"] for headers, _ in client.turns]
    assert statuses.count("compacted") >= 1, statuses
    # Every turn with references counted within 10% of what the upstream counted of the
    # history it received: the referenced answers resolved, at their full length (the
    # first turn, far below the trigger, is only estimated).
    for headers, theirs in client.turns[1:]:
        ours = int(headers["x-context-tokens"])
        assert abs(ours - theirs) <= 0.1 * theirs, (statuses, ours, theirs)
        assert "x-compaction-unresolved-references" not in headers
    # The summarizer read the referenced answers' text, never an unseen placeholder.
    prompts = _summarizer_prompts(sim)
    answers = [i for i in client.whole[:8] if i.get("role") == "assistant"]
    assert len(answers) == 4
    for answer in answers:
        assert answer["content"][0]["text"] in prompts
    assert "earlier output not seen" not in prompts
    # References went upstream as references (the simulator resolved them), never expanded.
    sent = [r["body"] for r in upstream_requests(sim) if "input" in r["body"]]
    assert any(i.get("type") == "item_reference" for i in sent[-1]["input"])
    assert not any(i.get("role") == "assistant" and "id" in i for b in sent for i in b["input"])
    sim_stats = stats(sim)
    assert (sim_stats["rejected_structure"], sim_stats["overflows"]) == (0, 0)


def test_an_unknown_reference_is_counted_conservatively_and_reported(
    sim: str, start_proxy: Callable[..., str]
) -> None:
    """One the proxy never relayed (another route answered it): 512 tokens, a header and a
    metric; the upstream still resolves it."""
    direct = Referencing(sim)
    direct.turn("Hello there.")
    proxy = start_proxy(settings(sim))
    via_proxy = Referencing(proxy, items=list(direct.items), whole=list(direct.whole))
    via_proxy.turn("And now?")
    headers, theirs = via_proxy.turns[-1]
    assert headers["x-compaction-unresolved-references"] == "1"
    assert int(headers["x-context-tokens"]) >= theirs + 512 - REPLY_TOKENS - 20
    metrics = httpx.get(f"{proxy}/metrics").text
    assert 'compaction_proxy_item_references_total{outcome="unresolved"} 1.0' in metrics
    via_proxy.turn("Once more.")  # the answer it relayed itself reads whole
    headers, _ = via_proxy.turns[-1]
    assert headers["x-compaction-unresolved-references"] == "1"  # still only the first
    assert (
        'compaction_proxy_item_references_total{outcome="resolved"} 1.0'
        in httpx.get(f"{proxy}/metrics").text
    )


def test_a_stream_that_opens_with_comments_keeps_its_items(
    sim: str, start_proxy: Callable[..., str]
) -> None:
    """The held-head path (stream_head.py): comments relayed before the first event."""
    proxy = start_proxy(settings(sim))
    client = Referencing(proxy, stream=True, headers={"X-Sim-Thinking-Ms": "300"})
    client.turn("Hello there.")
    client.turn("And now?")
    headers, theirs = client.turns[-1]
    assert "x-compaction-unresolved-references" not in headers
    assert abs(int(headers["x-context-tokens"]) - theirs) <= 0.1 * theirs


@pytest.mark.redis
def test_a_replica_reads_the_answers_another_relayed(
    sim: str, start_proxy: Callable[..., str], redis_server: RedisServer
) -> None:
    first = start_proxy(settings(sim, redis_server.url))
    second = start_proxy(settings(sim, redis_server.url))
    client = Referencing(first)
    client.turn("Hello there.")
    client.base = second
    client.turn("And now?")
    headers, theirs = client.turns[-1]
    assert "x-compaction-unresolved-references" not in headers
    assert abs(int(headers["x-context-tokens"]) - theirs) <= 0.1 * theirs
