"""Issue 24 item 5: a window learned from an overflow that states no limit is never
above the model's real one.

The rejection only says that what was sent is too much: the window learned from it
is at most the messages sent, less a margin, never those plus the reply the proxy
reserved (3,378 learned for a 3,000-token model before). Over real HTTP, the
simulator playing a 3,000-token model behind a proxy configured for 8,192: on the
Responses API (its ``context_length_exceeded`` states no limit) and on Chat
Completions behind a gateway whose 413 states none either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from tests.support.chat import Chat, stats
from tests.support.responses import settings
from tests.support.servers import OPEN_CLIENTS

REAL = 3000
CONFIGURED = 8192
# ~110 tokens a turn with the reply: the first overflow comes soon after the real window.
TEXT = "note the details of the plan as we go along, step by step. " * 8


def _learned_after_overflows(turn: Callable[[int], int], sim: str, turns: int) -> list[int]:
    """The X-Context-Window of every turn from the first overflow on."""
    windows: list[int] = []
    for i in range(turns):
        window = turn(i)
        if stats(sim)["overflows"] >= 1:
            windows.append(window)
    return windows


def test_a_responses_overflow_without_a_limit_learns_at_most_the_real_window(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset, window=CONFIGURED))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-a", max_retries=0)
    OPEN_CLIENTS.append(client)
    headers = {"X-Sim-Context-Window": str(REAL), "X-Session-Id": "responses-bound"}
    items: list[dict[str, Any]] = []

    def turn(i: int) -> int:
        items.append({"role": "user", "content": f"Turn {i}: {TEXT}"})
        raw = client.responses.with_raw_response.create(
            model="sim-8k", input=items, store=False, extra_headers=headers
        )
        items.extend(item.model_dump(exclude_none=True) for item in raw.parse().output)
        return int(raw.headers["x-context-window"])

    windows = _learned_after_overflows(turn, sim_reset, 40)
    assert windows, "no overflow: the conversation never passed the real window"
    assert max(windows) <= REAL, windows
    assert stats(sim_reset)["overflows"] == 1  # learned once, below the limit: no second


def test_a_chat_overflow_without_a_limit_learns_at_most_the_real_window(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset, window=CONFIGURED))
    chat = Chat(url, window=None, session="chat-bound")
    chat.headers = {"X-Sim-Context-Window": str(REAL), "X-Sim-Error-Format": "gateway413"}

    def turn(i: int) -> int:
        chat.say(f"Turn {i}: {TEXT}")
        assert chat.last is not None
        return int(chat.last["x-context-window"])

    windows = _learned_after_overflows(turn, sim_reset, 40)
    assert windows, "no overflow: the conversation never passed the real window"
    assert max(windows) <= REAL, windows
    assert stats(sim_reset)["overflows"] == 1
