"""Issue 4 end to end: overflow answers are recovered, learned from, and never loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from proxy.simulator.config import ERROR_FORMATS
from tests.support.chat import FILLER, Chat, chat_requests, stats
from tests.support.servers import OPEN_CLIENTS, proxy_settings

REAL_WINDOW = 6144
CONFIGURED = 32768


def wrong_window_settings(sim: str, **compaction: Any) -> Any:
    return proxy_settings(
        sim,
        models=[{"match": "sim-4k", "context_window": CONFIGURED, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, **compaction},
    )


@pytest.mark.parametrize("error_format", ERROR_FORMATS)
def test_60_turns_succeed_with_a_window_smaller_than_configured(
    sim_reset: str, start_proxy: Callable[..., str], error_format: str
) -> None:
    url = start_proxy(wrong_window_settings(sim_reset))
    chat = Chat(url, window=None, session=f"wrong-{error_format}")
    chat.headers = {
        "X-Sim-Context-Window": str(REAL_WINDOW),
        "X-Sim-Error-Format": error_format,
    }
    chat.say("FACT origin=first-turn")
    for turn in range(60):
        chat.say(f"Turn {turn}: {FILLER}{FILLER}")  # every call must succeed
    assert chat.say("RECALL origin") == "origin=first-turn"
    sim = stats(sim_reset)
    assert 1 <= sim["overflows"] <= 4, sim
    assert chat.statuses["compacted"] + chat.statuses["trimmed"] >= 1
    metrics = httpx.get(f"{url}/metrics").text
    assert 'outcome="recovered"' in metrics
    assert "compaction_proxy_learned_window_tokens" in metrics


def test_recovery_works_with_compaction_disabled(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(wrong_window_settings(sim_reset, enabled=False))
    chat = Chat(url, window=None, session="disabled")
    chat.headers = {"X-Sim-Context-Window": str(REAL_WINDOW)}
    for turn in range(45):
        chat.say(f"Turn {turn}: {FILLER}{FILLER}")
    assert stats(sim_reset)["overflows"] >= 1
    assert chat.statuses["trimmed"] + chat.statuses["compacted"] >= 1


def test_output_budget_is_lowered_and_retried_once(proxy: str, sim_reset: str) -> None:
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-test", max_retries=0)
    OPEN_CLIENTS.append(client)
    raw = client.chat.completions.with_raw_response.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=99_999,
        extra_headers={"X-Sim-Max-Output-Tokens": "1000"},
    )
    assert raw.parse().choices[0].message.content
    sent = [r["body"].get("max_tokens") for r in chat_requests(sim_reset)]
    assert sent == [99_999, 1000]


def test_newest_message_alone_over_the_window_is_a_clear_error(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(wrong_window_settings(sim_reset))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
    OPEN_CLIENTS.append(client)
    huge = "word " * 9000  # ~9k tokens: more than the real 6k window on its own
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="sim-4k",
            messages=[{"role": "user", "content": huge}],
            extra_headers={"X-Sim-Context-Window": str(REAL_WINDOW)},
        )
    assert info.value.code == "context_length_exceeded"
    assert "proxy" not in str(info.value.body)  # reads like the provider's own error
    # One upstream attempt, then the proxy's own answer: no loop, no silent truncation.
    requests = chat_requests(sim_reset)
    assert len(requests) == 1
    assert requests[0]["body"]["messages"][-1]["content"] == huge


def test_second_failure_is_returned_unchanged(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """A gateway that rejects every body: one retry, then its own answer."""
    url = start_proxy(wrong_window_settings(sim_reset))
    headers = {"X-Sim-Error-Format": "gateway413", "X-Sim-Context-Window": "350"}
    messages = [{"role": "system", "content": "sys " * 300}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} " + "x " * 60}
        for i in range(11)
    ]
    direct = httpx.post(
        f"{sim_reset}/v1/chat/completions",
        json={"model": "sim-4k", "messages": messages},
        headers=headers,
    )
    httpx.delete(f"{sim_reset}/_sim/requests")
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sim-4k", "messages": messages},
        headers=headers,
    )
    assert r.status_code == direct.status_code == 413
    assert r.content == direct.content
    assert len(chat_requests(sim_reset)) == 2


def test_other_upstream_400s_are_not_retried(proxy: str, sim_reset: str) -> None:
    orphan = [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]
    direct = httpx.post(f"{sim_reset}/v1/chat/completions", json={"model": "m", "messages": orphan})
    httpx.delete(f"{sim_reset}/_sim/requests")
    r = httpx.post(f"{proxy}/v1/chat/completions", json={"model": "m", "messages": orphan})
    assert r.status_code == direct.status_code == 400
    assert r.content == direct.content
    assert len(chat_requests(sim_reset)) == 1
