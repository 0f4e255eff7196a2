"""Pinned user messages (compaction.pin_first_user, compaction.pin_user_prefixes) over
real HTTP: a Codex-shaped Responses conversation (instructions, a developer message,
the client's context as user messages, then the turns) through the proxy to the
simulator. With the rule, the context messages reach the upstream verbatim, right
after the developer message, in every request after a compaction; without it they
are summarized away with the turns around them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from proxy.core.wording import HANDOFF_INTRO
from tests.support.chat import (
    FILLER,
    Chat,
    chat_requests,
    small_window_settings,
    stats,
    upstream_requests,
)
from tests.support.responses import settings

WINDOW = 4096
DEVELOPER = {"type": "message", "role": "developer", "content": [
    {"type": "input_text", "text": "<permissions instructions>sandbox: workspace-write"}
]}  # fmt: skip
AGENTS = "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\nRun make test.\n</INSTRUCTIONS>"
ENVIRONMENT = (
    "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n</environment_context>"
)
CODEX_PREFIXES = ["<environment_context>", "# AGENTS.md instructions", "<user_instructions>"]


def _user(*texts: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text} for text in texts],
    }


# Codex sends its context as one user message of several parts (AGENTS.md, then the
# environment); earlier releases sent each as a user message of its own.
ONE_MESSAGE = [_user(AGENTS, ENVIRONMENT)]
TWO_MESSAGES = [_user(AGENTS), _user(ENVIRONMENT)]


def converse(proxy: str, context: list[dict[str, Any]], turns: int) -> Counter[str]:
    """A Codex-like client: stateless Responses turns, the session named by
    ``prompt_cache_key`` (Codex's thread id), every output item kept."""
    items: list[dict[str, Any]] = [DEVELOPER, *context]
    statuses: Counter[str] = Counter()
    with httpx.Client(timeout=60) as client:
        for turn in range(turns):
            items.append(_user(f"Turn {turn}: {FILLER * 3}"))
            answer = client.post(
                f"{proxy}/v1/responses",
                headers={"Authorization": "Bearer sk-codex", "X-Sim-Context-Window": str(WINDOW)},
                json={
                    "model": "sim-4k",
                    "instructions": "You are Codex, a coding agent.",
                    "input": items,
                    "store": False,
                    "prompt_cache_key": "thread-1",
                },
            )
            assert answer.status_code == 200, answer.text
            statuses[answer.headers["x-compaction-status"]] += 1
            items += answer.json()["output"]
    return statuses


def after_compaction(sim: str) -> list[list[dict[str, Any]]]:
    """The input of every upstream turn that carried a handoff summary."""
    inputs = [request["body"]["input"] for request in chat_requests(sim)]
    return [i for i in inputs if any(HANDOFF_INTRO in orjson.dumps(item).decode() for item in i)]


# What a transcript quotes: asked as the turn's own request (summary_prompt: cached) a
# summary call opens with the pinned messages, the prefix the provider's cache serves.
TRANSCRIPT = {"summary_prompt": "transcript"}


def summarized(sim: str, text: str) -> bool:
    """Whether a summarizer call was handed ``text`` (as JSON-escaped in its body)."""
    needle = orjson.dumps(text)[1:-1].decode()
    return any(
        needle in orjson.dumps(request["body"]).decode()
        for request in upstream_requests(sim)
        if request["headers"].get("x-compaction-purpose") == "summarize"
    )


@pytest.mark.parametrize(
    ("compaction", "context", "pinned"),
    [
        ({"pin_first_user": True}, ONE_MESSAGE, 1),
        ({"pin_user_prefixes": CODEX_PREFIXES}, ONE_MESSAGE, 1),
        ({"pin_user_prefixes": CODEX_PREFIXES}, TWO_MESSAGES, 2),
        # The first user message only: the environment of the older layout is summarized.
        ({"pin_first_user": True}, TWO_MESSAGES, 1),
        ({}, ONE_MESSAGE, 0),
        ({"pin_user_prefixes": ["<nothing_like_it>"]}, ONE_MESSAGE, 0),
    ],
)
def test_context_messages_stay_verbatim_after_compaction(
    sim_reset: str,
    start_proxy: Callable[..., str],
    compaction: dict[str, Any],
    context: list[dict[str, Any]],
    pinned: int,
) -> None:
    proxy = start_proxy(settings(sim_reset, WINDOW, **compaction, **TRANSCRIPT))
    statuses = converse(proxy, context, turns=24)
    assert statuses["compacted"] >= 1, statuses
    compacted = after_compaction(sim_reset)
    assert len(compacted) >= 3, len(compacted)  # the compacting turn and later ones
    for sent in compacted:
        # The developer message, then exactly the pinned context, byte for byte; then
        # the handoff summary.
        assert sent[: 1 + pinned] == [DEVELOPER, *context[:pinned]]
        assert HANDOFF_INTRO in orjson.dumps(sent[1 + pinned]).decode()
    assert summarized(sim_reset, ENVIRONMENT) == (pinned < len(context))
    assert summarized(sim_reset, AGENTS) == (pinned == 0)
    sim = stats(sim_reset)
    assert sim["rejected_structure"] == 0
    assert sim["overflows"] == 0


@pytest.mark.parametrize("pin_first_user", [True, False])
def test_the_first_user_message_on_chat_completions(
    sim_reset: str, start_proxy: Callable[..., str], pin_first_user: bool
) -> None:
    """The same on chat completions: the task a conversation opens with."""
    settings = small_window_settings(sim_reset, pin_first_user=pin_first_user, **TRANSCRIPT)
    proxy = start_proxy(settings)
    chat = Chat(proxy, session="pinned")
    task = "The task: keep the release notes of project Ardent. " + FILLER
    chat.say(task)
    for turn in range(30):
        chat.say(f"Turn {turn}: {FILLER * 2}")
    assert chat.statuses["compacted"] >= 2, chat.statuses
    compacted = [
        r["body"]["messages"]
        for r in chat_requests(sim_reset)
        if any(HANDOFF_INTRO in str(m.get("content")) for m in r["body"]["messages"])
    ]
    assert len(compacted) >= 3
    for sent in compacted:
        assert (sent[1] == {"role": "user", "content": task}) == pin_first_user
    assert summarized(sim_reset, task) != pin_first_user
    assert stats(sim_reset)["rejected_structure"] == 0
