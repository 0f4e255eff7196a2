"""A Messages API conversation through a real proxy with the official ``anthropic`` SDK,
as Claude Code holds one: its whole history sent every turn, tools and extended
thinking, ``create`` and ``stream`` in turn."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anthropic

from tests.support.chat import WINDOW
from tests.support.servers import OPEN_CLIENTS

SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": "You are a careful coding agent."},
    {
        "type": "text",
        "text": "Project rules: keep notes; answer briefly.",
        "cache_control": {"type": "ephemeral"},
    },
]
TOOLS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
    }
]
THINKING: dict[str, Any] = {"type": "enabled", "budget_tokens": 1024}


def with_breakpoint(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` with a ``cache_control`` breakpoint on its newest message's last block,
    as Claude Code marks it (the history itself unchanged: older turns carry none)."""
    last = history[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    return [*history[:-1], {**last, "content": blocks}]


@dataclass
class Claude:
    """A client that keeps its full history, alternating ``create`` and ``stream``."""

    base: str
    key: str = "sk-ant-tenant-a"
    session: str | None = None
    metadata: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    turns: int = 0
    max_tokens: int = 256
    # Per request: (input_tokens, cache_read_input_tokens, cache_creation_input_tokens).
    usage: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = anthropic.Anthropic(base_url=self.base, api_key=self.key, max_retries=0)
        OPEN_CLIENTS.append(self.client)

    def send(self) -> list[dict[str, Any]]:
        """One request with the history; the answer's content blocks, as the SDK gives
        them back (thinking signatures included)."""
        headers = {"X-Sim-Context-Window": str(WINDOW), **self.headers}
        if self.session:
            headers["X-Session-Id"] = self.session
        extra: dict[str, Any] = {}
        if self.metadata is not None:
            extra["metadata"] = self.metadata
        args: dict[str, Any] = {
            "model": "sim-4k",
            "max_tokens": self.max_tokens,
            "system": SYSTEM,
            "messages": with_breakpoint(self.history),
            "tools": TOOLS,
            "thinking": THINKING,
            "extra_headers": headers,
            **extra,
        }
        self.turns += 1
        if self.turns % 2:
            raw = self.client.messages.with_raw_response.create(**args)
            self.statuses[raw.headers["x-compaction-status"]] += 1
            message = raw.parse()
        else:
            with self.client.messages.stream(**args) as stream:
                status = stream.response.headers["x-compaction-status"]
                self.statuses[status] += 1
                message = stream.get_final_message()
        u = message.usage
        self.usage.append(
            (u.input_tokens, u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0)
        )
        return [block.model_dump(exclude_none=True) for block in message.content]

    def say(self, text: str) -> str:
        """A user turn; tool calls the model asks for are answered, as an agent does,
        until it writes text. Returns that text."""
        self.history.append({"role": "user", "content": text})
        while True:
            content = self.send()
            self.history.append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            if not uses:
                return "".join(b["text"] for b in content if b["type"] == "text")
            results: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": f"contents {b['id']}"}
                for b in uses
            ]
            self.history.append({"role": "user", "content": results})
