"""A summary asked as the request itself, in each API's shape (routes/summary_bodies.py):
what stays as the client sent it (the cached prefix), what is the summary's own."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from proxy.routes.messages import chat_view as messages_chat_view
from proxy.routes.responses import chat_view as responses_chat_view
from proxy.routes.summary_bodies import (
    chat_summary,
    forces_tool,
    messages_summary,
    responses_summary,
)
from proxy.types import ChatMessage

ASK = ChatMessage(role="user", content="Write the summary now.")
BREAKPOINT = {"type": "ephemeral"}


def test_a_chat_summary_keeps_the_prompt_and_sets_the_answer() -> None:
    data: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "prompt_cache_key": "k",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 9000,
        "response_format": {"type": "json_object"},
        "store": True,
    }
    shaped = chat_summary(data, [*data["messages"], ASK], 400)
    assert shaped is not None
    body, allowed = orjson.loads(shaped[0]), shaped[1]
    assert body["messages"] == [*data["messages"], ASK]
    assert (body["tools"], body["tool_choice"], body["prompt_cache_key"]) == (
        data["tools"],
        "auto",
        "k",
    )
    assert (body["stream"], body["max_tokens"], body["temperature"], allowed) == (
        False,
        400,
        0,
        400,
    )
    for gone in ("stream_options", "max_completion_tokens", "response_format", "store"):
        assert gone not in body


@pytest.mark.parametrize(
    ("choice", "forced"),
    [
        (None, False),
        ("auto", False),
        ("none", False),
        ({"type": "auto"}, False),
        ("required", True),
        ({"type": "function", "function": {"name": "f"}}, True),
        ({"type": "any"}, True),
        ({"type": "tool", "name": "f"}, True),
    ],
)
def test_a_forced_tool_call_is_no_summary(choice: object, forced: bool) -> None:
    assert forces_tool(choice) is forced
    data = {"model": "m", "messages": [], "tool_choice": choice}
    assert (chat_summary(data, [ASK], 400) is None) is forced
    assert (messages_summary(data, [ASK], 400) is None) is forced


def _messages_request(**extra: Any) -> dict[str, Any]:
    return {
        "model": "claude",
        "max_tokens": 256,
        "system": [{"type": "text", "text": "rules", "cache_control": BREAKPOINT}],
        "tools": [{"name": "f", "input_schema": {}, "cache_control": BREAKPOINT}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a", "cache_control": BREAKPOINT}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "c", "cache_control": BREAKPOINT}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "d"}]},
            {"role": "user", "content": "e"},
        ],
        "stream": True,
        **extra,
    }


def test_a_messages_summary_puts_a_breakpoint_at_the_instruction_within_four() -> None:
    data = _messages_request()
    before = copy.deepcopy(data)
    view = messages_chat_view(data)["messages"]
    shaped = messages_summary(data, [*view[:-1], ASK], 400)  # the newest message is not sent
    assert shaped is not None
    body = orjson.loads(shaped[0])
    assert data == before  # the client's own objects untouched
    assert body["system"] == data["system"]
    assert body["tools"] == data["tools"]
    last = body["messages"][-1]
    assert last["role"] == "user"
    assert last["content"][-1] == {
        "type": "text",
        "text": ASK["content"],
        "cache_control": BREAKPOINT,
    }
    # tools 1 + system 1 + messages: the instruction's and the newest of the client's two
    marked = [b for m in body["messages"] for b in m["content"] if "cache_control" in b]
    assert [b["text"] for b in marked] == ["c", ASK["content"]]
    assert (body["stream"], body["max_tokens"], body["temperature"]) == (False, 400, 0)


def test_a_messages_summary_with_thinking_keeps_it_and_adds_its_budget() -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    data = _messages_request(thinking=thinking)
    view = messages_chat_view(data)["messages"]
    shaped = messages_summary(data, [*view[:2], ASK], 400)
    assert shaped is not None
    body, allowed = orjson.loads(shaped[0]), shaped[1]
    assert body["thinking"] == thinking
    assert body["max_tokens"] == allowed == 1424
    assert "temperature" not in body  # thinking allows only the default


def test_a_responses_summary_is_not_stored_and_drops_the_output_format() -> None:
    data: dict[str, Any] = {
        "model": "m",
        "instructions": "rules",
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "text": {"format": {"type": "json_object"}},
        "stream": True,
    }
    view = responses_chat_view(data)["messages"]
    shaped = responses_summary(data, [*view, ASK], 400)
    assert shaped is not None
    body = orjson.loads(shaped[0])
    assert body["instructions"] == "rules"
    assert body["tools"] == data["tools"]
    assert body["input"][-1] == {"type": "message", "role": "user", "content": ASK["content"]}
    assert (body["store"], body["stream"], body["max_output_tokens"]) == (False, False, 400)
    assert "text" not in body
