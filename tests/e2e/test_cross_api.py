"""Issue 25 item 3: one snapshot across APIs. A conversation with planted facts goes
chat completions -> Messages -> Responses -> chat completions on one session name and
one key (``Authorization: Bearer`` for the OpenAI SDK, ``x-api-key`` for the Anthropic
one), each time carrying the whole history in that API's shape; the session keeps one
summary chain (no summary from scratch on a switch) and every fact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.support.chat import FILLER, TOOLS, WINDOW, stats
from tests.support.servers import OPEN_CLIENTS, proxy_settings

KEY = "sk-cross-tenant"
SESSION = "one-conversation"
SYSTEM = "You are a careful assistant."
Call = tuple[str, str, str]  # id, name, arguments (JSON text)
CHAT_TOOLS: Any = TOOLS
MESSAGES_TOOLS = [
    {"name": t["function"]["name"], "description": "", "input_schema": t["function"]["parameters"]}
    for t in TOOLS
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture
def proxy4k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return start_proxy(
        proxy_settings(
            sim_reset,
            models=[{"match": "sim-*", "context_window": WINDOW, "max_output_tokens": 256}],
            compaction={"summary_max_tokens": 400, "precompact_ratio": None},
        )
    )


@dataclass
class Turn:
    api: str
    status: str
    version: int


@dataclass
class Client:
    """One user holding one conversation, sending it whole to whichever API it uses now,
    in that API's shape, with the same key. Turns: ``{"role": "user", "text"}``,
    ``{"role": "assistant", "text", "calls": [(id, name, arguments)]}`` and
    ``{"role": "tool", "id", "text"}``; a tool call the model asks for is answered, as
    an agent does, until it writes text."""

    base: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    log: list[Turn] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.openai = openai.OpenAI(base_url=f"{self.base}/v1", api_key=KEY, max_retries=0)
        # Claude Code's way: the key as x-api-key (this SDK sends api_key as a Bearer token).
        self.anthropic = anthropic.Anthropic(
            base_url=self.base, api_key=None, default_headers={"x-api-key": KEY}, max_retries=0
        )
        OPEN_CLIENTS.extend([self.openai, self.anthropic])

    def say(self, api: str, text: str) -> str:
        self.turns.append({"role": "user", "text": text})
        headers = {"X-Session-Id": SESSION, "X-Sim-Context-Window": str(WINDOW)}
        while True:
            reply, calls, raw = getattr(self, api)(headers)
            status, version = raw["x-compaction-status"], int(raw["x-compaction-version"])
            self.log.append(Turn(api, status, version))
            self.turns.append({"role": "assistant", "text": reply, "calls": calls})
            if not calls:
                return reply
            for call_id, name, _ in calls:
                self.turns.append({"role": "tool", "id": call_id, "text": f"{name}: contents"})

    def chat(self, headers: dict[str, str]) -> tuple[str, list[Call], httpx.Headers]:
        history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for t in self.turns:
            if t["role"] == "tool":
                history.append({"role": "tool", "tool_call_id": t["id"], "content": t["text"]})
                continue
            history.append({"role": t["role"], "content": t["text"] or None})
            if t.get("calls"):
                history[-1]["tool_calls"] = [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, n, a in t["calls"]
                ]
        raw = self.openai.chat.completions.with_raw_response.create(
            model="sim-4k", messages=history, tools=CHAT_TOOLS, extra_headers=headers
        )
        message = raw.parse().choices[0].message
        calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return message.content or "", calls, raw.headers

    def messages(self, headers: dict[str, str]) -> tuple[str, list[Call], httpx.Headers]:
        # Assistant turns as the content blocks the SDK hands back, as Claude Code keeps
        # them; a turn's tool results as one user message.
        history: list[dict[str, Any]] = []
        for t in self.turns:
            if t["role"] == "user":
                history.append({"role": "user", "content": t["text"]})
            elif t["role"] == "tool":
                result = {"type": "tool_result", "tool_use_id": t["id"], "content": t["text"]}
                if history[-1]["role"] == "user":
                    history[-1]["content"].append(result)
                else:
                    history.append({"role": "user", "content": [result]})
            else:
                text = [{"type": "text", "text": t["text"]}] if t["text"] else []
                uses = [
                    {"type": "tool_use", "id": i, "name": n, "input": orjson.loads(a)}
                    for i, n, a in t["calls"]
                ]
                history.append({"role": "assistant", "content": text + uses})
        raw = self.anthropic.messages.with_raw_response.create(
            model="sim-4k",
            max_tokens=256,
            system=SYSTEM,
            messages=history,  # type: ignore[arg-type]
            tools=MESSAGES_TOOLS,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        blocks = raw.parse().content
        calls = [
            (b.id, b.name, orjson.dumps(b.input).decode()) for b in blocks if b.type == "tool_use"
        ]
        return "".join(b.text for b in blocks if b.type == "text"), calls, raw.headers

    def responses(self, headers: dict[str, str]) -> tuple[str, list[Call], httpx.Headers]:
        # Assistant turns as the output items a stateless client sends back.
        items: list[dict[str, Any]] = []
        for t in self.turns:
            if t["role"] == "user":
                items.append({"role": "user", "content": t["text"]})
            elif t["role"] == "tool":
                output = {"type": "function_call_output", "call_id": t["id"], "output": t["text"]}
                items.append(output)
            else:
                if t["text"]:
                    text = {"type": "output_text", "text": t["text"], "annotations": []}
                    items.append({"type": "message", "role": "assistant", "content": [text]})
                items += [
                    {"type": "function_call", "call_id": i, "name": n, "arguments": a}
                    for i, n, a in t["calls"]
                ]
        raw = self.openai.responses.with_raw_response.create(
            model="sim-4k",
            instructions=SYSTEM,
            input=items,  # type: ignore[arg-type]
            tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
            store=False,
            extra_headers=headers,
        )
        output = raw.parse().output
        calls = [(o.call_id, o.name, o.arguments) for o in output if o.type == "function_call"]
        text = "".join(
            part.text
            for o in output
            if o.type == "message"
            for part in o.content
            if part.type == "output_text"
        )
        return text, calls, raw.headers


LEGS = ("chat", "messages", "responses", "chat")
TURNS_PER_LEG = 12


def test_chat_messages_responses_chat_share_one_summary_chain(proxy4k: str, sim_reset: str) -> None:
    client = Client(proxy4k)
    planted: dict[int, int] = {}  # fact -> its turn's index in the chat view
    starts: list[int] = []  # where each leg's requests start in the log
    for leg, api in enumerate(LEGS):
        starts.append(len(client.log))
        for i in range(TURNS_PER_LEG):
            n = leg * TURNS_PER_LEG + i
            fact = f" FACT k{n}=v{n * 7}" if n % 6 == 0 else ""
            if fact:
                planted[n] = 1 + len(client.turns)  # after the system message
            call = " CALL 1" if n % 5 == 4 else ""  # a tool loop, crossing too
            client.say(api, f"Turn {n} on {api}: {FILLER * 3}{fact}{call}")
    recall = client.say("chat", " ".join(f"RECALL k{n}" for n in planted))
    assert recall == " ".join(f"k{n}=v{n * 7}" for n in planted)

    log = client.log
    assert len(log) > len(LEGS) * TURNS_PER_LEG + 8  # tool loops: more requests than turns
    # Each API extended the chain: every leg compacted at least once.
    for api, start, end in zip(LEGS, starts, [*starts[1:], len(log)], strict=True):
        part = log[start:end]
        assert any(t.status == "compacted" for t in part), (api, part)
    # One chain: a summary adds one to the version, anything else keeps it.
    for before, now in pairwise(log):
        step = 1 if now.status == "compacted" else 0
        assert now.version == before.version + step, (before, now)
    # A switch uses the snapshot the other API made: no summary from scratch.
    for start in starts[1:]:
        assert log[start].status in ("snapshot", "compacted"), (log[start - 1], log[start])
    sim = stats(sim_reset)
    final = log[-1].version
    assert final >= len(LEGS)
    assert sim["summaries"] == final  # every summary the simulator wrote is in the chain
    assert sim["rejected_structure"] == 0
    assert sim["overflows"] == 0
    # The session as either header names the key: one tenant, one snapshot.
    for auth in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        found = httpx.get(f"{proxy4k}/sessions/{SESSION}", headers=auth)
        assert found.status_code == 200, (auth, found.text)
        session = found.json()
        assert session["version"] == final
        assert session["pinned_messages"] == 1
        covered = session["covered_messages"]
        assert 1 < covered < len(client.turns)
        summarized = [n for n, at in planted.items() if at < covered]
        assert summarized
        for n in summarized:
            assert f"k{n}=v{n * 7}" in session["summary"]
