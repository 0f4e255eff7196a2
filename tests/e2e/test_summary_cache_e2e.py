"""Issue 39 item 1 end to end: the summary call reads its input from the provider's prompt
cache. The real proxy under uvicorn, the official SDKs, the simulator upstream with its
prompt caches (OpenAI's rule on chat completions, Anthropic's breakpoints on Messages);
the share is read from the simulator's billing record of the summary call, never from
the proxy. With ``compaction.summary_prompt: transcript`` (the summary as it was asked
before) none of it is cached: the same assertions fail there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.chat import FILLER, Chat, chat_requests, upstream_requests
from tests.support.messages import Claude
from tests.support.servers import proxy_settings

WINDOW = 16384
MAX_TURNS = 120  # a compaction comes at about 60 turns; bounded either way


def _settings(sim: str, prompt: str) -> Any:
    return proxy_settings(
        sim,
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 1000, "precompact_ratio": None, "summary_prompt": prompt},
    )


def _summaries(sim: str) -> list[dict[str, Any]]:
    found = upstream_requests(sim)
    return [r for r in found if r["headers"].get("x-compaction-purpose") == "summarize"]


def _share(record: dict[str, Any]) -> float:
    """Of the call's input, the share its billing record says the cache served."""
    usage = record["usage"]
    if "prompt_tokens" in usage:  # chat completions: OpenAI's rule
        return float(usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"])
    total = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    return float(usage["cache_read_input_tokens"] / total)


def test_a_chat_summary_reads_its_input_from_the_prompt_cache(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(_settings(sim_reset, "cached"))
    chat = Chat(url, session="cached-summary", window=WINDOW)
    for turn in range(MAX_TURNS):
        chat.say(f"Turn {turn}: FACT k{turn}=v{turn}. {FILLER}")
        if chat.statuses["compacted"]:
            break
    assert chat.statuses["compacted"] == 1
    assert chat.last is not None
    assert "x-compaction-degraded" not in chat.last
    (summary,) = _summaries(sim_reset)
    # The turn's own request, the instruction last: the last request sent opens the same.
    sent = chat_requests(sim_reset)[-2]["body"]
    asked = summary["body"]["messages"]
    assert asked[:-1] == sent["messages"][: len(asked) - 1]
    assert asked[-1]["role"] == "user"
    assert "Stop the conversation here" in asked[-1]["content"]
    assert _share(summary) >= 0.8
    # The ledger reports what the cache served of the summary's input.
    auth = {"Authorization": f"Bearer {chat.key}"}
    ledger = httpx.get(f"{url}/sessions/cached-summary", headers=auth).json()["ledger"]
    usage = summary["usage"]
    assert ledger["summarizer_input"] == usage["prompt_tokens"]
    assert ledger["summarizer_cached"] == usage["prompt_tokens_details"]["cached_tokens"]
    # What the summary carried forward: the view after it recalls a fact of the span.
    assert chat.say("RECALL k3") == "k3=v3"


def test_a_messages_summary_reads_its_input_from_the_prompt_cache(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(_settings(sim_reset, "cached"))
    claude = Claude(url, session="cached-summary", headers={"X-Sim-Context-Window": str(WINDOW)})
    for turn in range(MAX_TURNS):
        claude.say(f"Turn {turn}: FACT k{turn}=v{turn}. {FILLER}")
        if claude.statuses["compacted"]:
            break
    assert claude.statuses["compacted"] == 1
    (summary,) = _summaries(sim_reset)
    body = summary["body"]
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}  # as the client's
    assert body["thinking"]["type"] == "enabled"  # kept: a change would lose the cache
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert _share(summary) >= 0.8
    ledger = httpx.get(f"{url}/sessions/cached-summary", headers={"x-api-key": claude.key}).json()[
        "ledger"
    ]
    assert ledger["summarizer_cached"] == summary["usage"]["cache_read_input_tokens"]


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_a_transcript_summary_reads_nothing_from_the_cache(
    api: str, sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """The summary as it was asked before (``summary_prompt: transcript``): a fresh system
    prompt and a transcript, which no request sent before."""
    url = start_proxy(_settings(sim_reset, "transcript"))
    client: Chat | Claude
    if api == "chat":
        client = Chat(url, session="transcript-summary", window=WINDOW)
    else:
        headers = {"X-Sim-Context-Window": str(WINDOW)}
        client = Claude(url, session="transcript-summary", headers=headers)
    for turn in range(MAX_TURNS):
        client.say(f"Turn {turn}: FACT k{turn}=v{turn}. {FILLER}")
        if client.statuses["compacted"]:
            break
    (summary,) = _summaries(sim_reset)
    share = _share(summary)
    assert share == 0
