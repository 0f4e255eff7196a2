"""A conversation through a real proxy in front of the simulator, and what the simulator
saw: the helpers the end-to-end compaction tests share (first written for
tests/e2e/test_compaction.py)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.servers import OPEN_CLIENTS, proxy_settings, run_server

WINDOW = 4096
FILLER = "please keep careful notes about the project as we go along. " * 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
]


def small_window_settings(sim: str, **compaction: Any) -> Any:
    """The 4k model. Compactions happen inline (the turn that crosses the trigger shows
    ``compacted``) unless ``precompact_ratio`` turns background pre-compaction on."""
    return proxy_settings(
        sim,
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None, **compaction},
    )


@dataclass
class Chat:
    """A client that keeps its full history, as Chat Completions clients do."""

    base: str
    key: str = "sk-tenant-a"
    session: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(
        default_factory=lambda: [{"role": "system", "content": "You are a helpful assistant."}]
    )
    statuses: Counter[str] = field(default_factory=Counter)
    last: httpx.Headers | None = None
    # The simulator's window for these requests; None: whatever self.headers say.
    window: int | None = WINDOW

    def __post_init__(self) -> None:
        self.client = openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.key, max_retries=0)
        OPEN_CLIENTS.append(self.client)

    def send(self, **extra: Any) -> Any:
        headers = dict(self.headers)
        if self.window is not None:
            headers.setdefault("X-Sim-Context-Window", str(self.window))
        if self.session:
            headers["X-Session-Id"] = self.session
        raw = self.client.chat.completions.with_raw_response.create(
            model="sim-4k", messages=self.history, extra_headers=headers, **extra
        )
        self.last = raw.headers
        self.statuses[raw.headers["x-compaction-status"]] += 1
        return raw.parse().choices[0].message

    def say(self, text: str) -> str:
        self.history.append({"role": "user", "content": text})
        message = self.send()
        self.history.append({"role": "assistant", "content": message.content})
        return str(message.content)


def upstream_requests(sim: str) -> list[dict[str, Any]]:
    return [r for r in httpx.get(f"{sim}/_sim/requests").json()]


def chat_requests(sim: str) -> list[dict[str, Any]]:
    """Requests the proxy forwarded for clients (not its own summarizer calls)."""
    return [
        r for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") != "summarize"
    ]


def stats(sim: str) -> dict[str, int]:
    return dict(httpx.get(f"{sim}/_sim/stats").json())


@pytest.fixture
def broken_summarizer() -> Iterator[str]:
    """A simulator whose "broken" model has a 64-token window: every summary overflows."""
    config = SimulatorConfig(
        models=(
            ModelRule(match="sim-4k", context_window=WINDOW),
            ModelRule(match="broken", context_window=64),
        )
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


HELLO = [{"role": "user", "content": "hello"}]


def recording_chat(
    url: str, session: str, headers: dict[str, str], window: int, key: str = "sk-tenant-a"
) -> tuple[Chat, list[bytes]]:
    """A ``Chat`` whose SDK client keeps the bytes of every request body it sends."""
    sent: list[bytes] = []

    def keep(request: httpx.Request) -> None:
        sent.append(request.read())

    chat = Chat(url, key=key, session=session, headers=headers, window=window)
    http = httpx.Client(event_hooks={"request": [keep]})
    chat.client = openai.OpenAI(
        base_url=f"{url}/v1", api_key=chat.key, max_retries=0, http_client=http
    )
    OPEN_CLIENTS.append(chat.client)
    return chat, sent


def assert_forwarded_as_sent(sim: str, sent: list[bytes]) -> None:
    """Each body the client sent reached the simulator byte for byte, in order: the
    simulator's record splices the raw body it received after ``"body":`` (then its
    usage, or the entry's end)."""
    raw = httpx.get(f"{sim}/_sim/requests").content
    at = 0
    for body in sent:
        found = raw.find(b'"body":' + body, at)
        assert found >= 0, "a request was not forwarded as the client sent it"
        at = found + len(b'"body":' + body)
        assert raw[at : at + 1] in (b"}", b",")  # the whole body, not a prefix of another


# A block of excerpts as it opens a user message (core/excerpts.py), and what follows it.
_BLOCK = re.compile(r"Verbatim excerpts .*?\n\[[0-9a-f]{8} end\](?:\n\n)?", re.S)


def without_excerpts(messages: list[Any]) -> list[Any]:
    """``messages`` as the client sent them: recall's excerpt blocks taken out (by design
    a block moves to the newest user message that has excerpts of its own)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and content.startswith("Verbatim excerpts"):
            rest = _BLOCK.sub("", content, count=1)
            if rest:
                out.append({**m, "content": rest})
            continue
        if (
            isinstance(content, list)
            and content
            and str(content[0].get("text", "")).startswith("Verbatim excerpts")
        ):
            out.append({**m, "content": content[1:]})
            continue
        out.append(m)
    return out
