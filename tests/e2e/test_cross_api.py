"""Issue 25 item 3: one snapshot across APIs. A conversation with planted facts goes
chat completions -> Messages -> Responses -> chat completions on one session name and
one key (``Authorization: Bearer`` for the OpenAI SDK, ``x-api-key`` for the Anthropic
one), each time carrying the whole history in that API's shape; the session keeps one
summary chain (no summary from scratch on a switch) and every fact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import anthropic
import httpx
import openai
import pytest

from tests.support.chat import FILLER, WINDOW, stats
from tests.support.servers import OPEN_CLIENTS, proxy_settings

KEY = "sk-cross-tenant"
SESSION = "one-conversation"
SYSTEM = "You are a careful assistant."


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
    """One user holding one conversation (plain text turns: (role, text)), sending it
    whole to whichever API it uses now, in that API's shape, with the same key."""

    base: str
    turns: list[tuple[str, str]] = field(default_factory=list)
    log: list[Turn] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.openai = openai.OpenAI(base_url=f"{self.base}/v1", api_key=KEY, max_retries=0)
        # Claude Code's way: the key as x-api-key (this SDK sends api_key as a Bearer token).
        self.anthropic = anthropic.Anthropic(
            base_url=self.base, api_key=None, default_headers={"x-api-key": KEY}, max_retries=0
        )
        OPEN_CLIENTS.extend([self.openai, self.anthropic])

    def say(self, api: str, text: str) -> str:
        self.turns.append(("user", text))
        headers = {"X-Session-Id": SESSION, "X-Sim-Context-Window": str(WINDOW)}
        reply, raw = getattr(self, api)(headers)
        self.log.append(Turn(api, raw["x-compaction-status"], int(raw["x-compaction-version"])))
        self.turns.append(("assistant", reply))
        return reply

    def chat(self, headers: dict[str, str]) -> tuple[str, httpx.Headers]:
        history = [{"role": role, "content": text} for role, text in self.turns]
        raw = self.openai.chat.completions.with_raw_response.create(
            model="sim-4k",
            messages=[{"role": "system", "content": SYSTEM}, *history],  # type: ignore[list-item]
            extra_headers=headers,
        )
        return str(raw.parse().choices[0].message.content), raw.headers

    def messages(self, headers: dict[str, str]) -> tuple[str, httpx.Headers]:
        # Assistant turns as the content blocks the SDK hands back, as Claude Code keeps them.
        history = [
            {"role": r, "content": t if r == "user" else [{"type": "text", "text": t}]}
            for r, t in self.turns
        ]
        raw = self.anthropic.messages.with_raw_response.create(
            model="sim-4k",
            max_tokens=256,
            system=SYSTEM,
            messages=history,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        blocks = raw.parse().content
        return "".join(b.text for b in blocks if b.type == "text"), raw.headers

    def responses(self, headers: dict[str, str]) -> tuple[str, httpx.Headers]:
        # Assistant turns as the output message items a stateless client sends back.
        items = [
            {"role": "user", "content": t}
            if r == "user"
            else {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": t, "annotations": []}],
            }
            for r, t in self.turns
        ]
        raw = self.openai.responses.with_raw_response.create(
            model="sim-4k",
            instructions=SYSTEM,
            input=items,  # type: ignore[arg-type]
            store=False,
            extra_headers=headers,
        )
        return raw.parse().output_text, raw.headers


LEGS = ("chat", "messages", "responses", "chat")
TURNS_PER_LEG = 12


def test_chat_messages_responses_chat_share_one_summary_chain(proxy4k: str, sim_reset: str) -> None:
    client = Client(proxy4k)
    for leg, api in enumerate(LEGS):
        for i in range(TURNS_PER_LEG):
            n = leg * TURNS_PER_LEG + i
            fact = f" FACT k{n}=v{n * 7}" if n % 6 == 0 else ""
            client.say(api, f"Turn {n} on {api}: {FILLER * 3}{fact}")
    keys = [n for n in range(len(LEGS) * TURNS_PER_LEG) if n % 6 == 0]
    recall = client.say("chat", " ".join(f"RECALL k{n}" for n in keys))
    assert recall == " ".join(f"k{n}=v{n * 7}" for n in keys)

    log = client.log
    # Each API extended the chain: every leg compacted at least once.
    for leg, api in enumerate(LEGS):
        part = log[leg * TURNS_PER_LEG : (leg + 1) * TURNS_PER_LEG]
        assert any(t.status == "compacted" for t in part), (api, part)
    # One chain: a summary adds one to the version, anything else keeps it.
    for before, now in pairwise(log):
        step = 1 if now.status == "compacted" else 0
        assert now.version == before.version + step, (before, now)
    # A switch uses the snapshot the other API made: no summary from scratch.
    for leg in range(1, len(LEGS)):
        first, last = log[leg * TURNS_PER_LEG], log[leg * TURNS_PER_LEG - 1]
        assert first.status in ("snapshot", "compacted"), (last, first)
    sim = stats(sim_reset)
    final = log[-1].version
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
        assert 1 < session["covered_messages"] < len(client.turns)
        for n in keys:
            if n < session["covered_messages"] // 2:
                assert f"k{n}=v{n * 7}" in session["summary"]
