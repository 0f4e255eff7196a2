"""Issue 25: ``POST /v1/messages`` compacted like a chat, end to end: a real proxy, the
official ``anthropic`` SDK as the client (create and stream, tools, extended thinking),
the simulator's Messages API (Anthropic's validation) as the upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from proxy.core.wording import handoff_text
from tests.support.chat import FILLER, small_window_settings, stats, upstream_requests
from tests.support.messages import SYSTEM, Claude
from tests.support.servers import OPEN_CLIENTS, proxy_settings


@pytest.fixture
def proxy4k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return start_proxy(small_window_settings(sim_reset))


def messages_requests(sim: str) -> list[dict[str, Any]]:
    """The Messages requests the proxy forwarded for the client (not summaries)."""
    return [
        r
        for r in upstream_requests(sim)
        if "system" in r["body"] and r["headers"].get("x-compaction-purpose") != "summarize"
    ]


def planted_conversation(claude: Claude, turns: int) -> None:
    """``turns`` user turns, a fact planted every 10th, a tool loop every 4th."""
    for turn in range(turns):
        fact = f" FACT k{turn}=v{turn * 7}" if turn % 10 == 0 else ""
        call = " CALL 1" if turn % 4 == 3 else ""
        claude.say(f"Turn {turn}: {FILLER}{fact}{call}")


def test_60_turns_with_tools_and_thinking_keep_every_fact(proxy4k: str, sim_reset: str) -> None:
    claude = Claude(proxy4k, session="long-messages")
    planted_conversation(claude, 60)
    for i in range(6):
        assert claude.say(f"RECALL k{i * 10}") == f"k{i * 10}=v{i * 70}"
    sim = stats(sim_reset)
    assert sim["overflows"] == 0
    assert sim["rejected_structure"] == 0
    assert sim["summaries"] >= 3
    assert claude.statuses["compacted"] >= 3
    forwarded = messages_requests(sim_reset)
    assert len(forwarded) == claude.turns
    pinned = orjson.dumps(SYSTEM)
    for request in forwarded:
        # The system blocks, cache_control included, byte for byte in every request.
        assert orjson.dumps(request["body"]["system"]) == pinned
        assert request["body"]["messages"][0]["role"] == "user"
    compacted = [r for r in forwarded if len(r["body"]["messages"]) < len(claude.history) // 2]
    assert compacted, "late requests should carry a compacted history"
    # Between compactions the pinned system and the summary turns stay byte-identical,
    # so the prompt cache (the simulator's, keyed on the prefix up to each breakpoint)
    # serves most of each prompt.
    read = sum(r for _, r, _ in claude.usage)
    total = sum(i + r + c for i, r, c in claude.usage)
    assert read / total > 0.6, (read, total)


def test_prefix_is_byte_identical_between_compactions(proxy4k: str, sim_reset: str) -> None:
    claude = Claude(proxy4k, session="prefix-messages")
    versions: list[int] = []
    for turn in range(70):
        claude.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        raw = claude.client.messages.with_raw_response.create(
            model="sim-4k",
            max_tokens=256,
            system=SYSTEM,  # type: ignore[arg-type]
            messages=claude.history,  # type: ignore[arg-type]
            extra_headers={"X-Sim-Context-Window": "4096", "X-Session-Id": "prefix-messages"},
        )
        versions.append(int(raw.headers["x-compaction-version"]))
        text = raw.parse().content[0].text  # type: ignore[union-attr]
        claude.history.append({"role": "assistant", "content": text})
    by_version: dict[int, set[bytes]] = {}
    for version, request in zip(versions, messages_requests(sim_reset), strict=True):
        if version == 0:
            continue
        messages = request["body"]["messages"]
        handoff = messages[0]["content"]
        assert isinstance(handoff, str)
        assert handoff.startswith(handoff_text("")[:20])
        cut = next(i for i, m in enumerate(messages) if str(m["content"]).startswith("Turn"))
        by_version.setdefault(version, set()).add(orjson.dumps(messages[:cut]))
    assert len(by_version) >= 2, "the conversation should compact more than once"
    for version, prefixes in by_version.items():
        assert len(prefixes) == 1, f"prefix changed within snapshot version {version}"


def test_claude_code_session_in_metadata_user_id(proxy4k: str, sim_reset: str) -> None:
    """Claude Code names its session inside ``metadata.user_id``: before 2.1.78 as
    ``user_<hash>_account_<uuid>_session_<uuid>``, since then as a JSON string."""
    legacy = "7f1c0a52-3b1e-4c4f-9d0e-2a4a3f6b8c11"
    current = "0b6d3c1e-8f2a-4e7b-a1c9-5d4e3f2a1b0c"
    user_ids = {
        legacy: f"user_{'ab' * 32}_account__session_{legacy}",
        current: orjson.dumps({"device_id": "d", "account_uuid": "", "session_id": current}),
    }
    for session, user_id in user_ids.items():
        user = user_id if isinstance(user_id, str) else user_id.decode()
        claude = Claude(proxy4k, metadata={"user_id": user})
        planted_conversation(claude, 24)
        assert claude.statuses["compacted"] >= 1
        found = httpx.get(
            f"{proxy4k}/sessions/{session}",
            headers={"Authorization": f"Bearer {claude.key}"},
        )
        assert found.status_code == 200, session
        assert found.json()["version"] >= 1
        assert claude.say("RECALL k0 RECALL k10 RECALL k20") == "k0=v0 k10=v70 k20=v140"


def test_anthropic_headers_and_api_key_pass_through(proxy4k: str, sim_reset: str) -> None:
    sent = {
        "x-api-key": "sk-ant-by-header",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "interleaved-thinking-2025-05-14",
    }
    body = {
        "model": "sim-4k",
        "max_tokens": 50,
        "system": "s",
        "messages": [{"role": "user", "content": "hi"}],
    }
    answer = httpx.post(f"{proxy4k}/v1/messages", json=body, headers=sent)
    assert answer.status_code == 200, answer.text
    (request,) = messages_requests(sim_reset)
    for name, value in sent.items():
        assert request["headers"][name] == value
    counted = httpx.post(
        f"{proxy4k}/v1/messages/count_tokens",
        json={"model": "sim-4k", "messages": [{"role": "user", "content": "hello"}]},
        headers={"x-api-key": "sk-ant-tenant-a", "anthropic-version": "2023-06-01"},
    )
    assert counted.status_code == 200
    assert counted.json()["input_tokens"] > 0


REAL_WINDOW = 3000


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_too_long_is_recovered_and_the_window_learned(
    sim_reset: str, start_proxy: Callable[..., str], stream: bool
) -> None:
    """The upstream's window is smaller than configured: "prompt is too long" (a 400, or
    a stream's first ``error`` event) compacts against the stated limit and retries."""
    proxy = start_proxy(
        proxy_settings(
            sim_reset,
            models=[{"match": "sim-4k", "context_window": 32768, "max_output_tokens": 256}],
            compaction={"summary_max_tokens": 400},
        )
    )
    # A small answer budget: the prompt grows past the window, never just the answer.
    claude = Claude(proxy, session=f"learned-{stream}", max_tokens=32)
    claude.headers = {"X-Sim-Context-Window": str(REAL_WINDOW)}
    if stream:
        claude.headers["X-Sim-Errors-In-Stream"] = "1"
    for turn in range(30):
        fact = f" FACT k{turn}=v{turn * 7}" if turn % 10 == 0 else ""
        text = f"Turn {turn}: {FILLER}{fact}"
        if stream:  # every request streamed: the overflow comes as an event
            claude.turns = 1
        claude.say(text)
    assert claude.say("RECALL k0 RECALL k10 RECALL k20") == "k0=v0 k10=v70 k20=v140"
    sim = stats(sim_reset)
    assert sim["overflows"] >= 1
    assert sim["rejected_structure"] == 0
    assert claude.statuses["compacted"] >= 1
    # Recovered by compacting, not by a shorter answer.
    assert {r["body"]["max_tokens"] for r in messages_requests(sim_reset)} == {32}


def test_max_tokens_over_the_context_is_lowered(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """ "input length and `max_tokens` exceed context limit": the prompt fits, so the
    retry asks for ``W - P`` tokens, as a 400 and as an in-stream error alike."""
    proxy = start_proxy(
        proxy_settings(
            sim_reset,
            models=[{"match": "sim-4k", "context_window": 32768, "max_output_tokens": 8192}],
        )
    )
    for stream in (False, True):
        claude = Claude(proxy, session=f"budget-{stream}", max_tokens=4090)
        claude.headers = {"X-Sim-Context-Window": "4096", "X-Sim-Max-Output-Tokens": "8192"}
        if stream:
            claude.headers["X-Sim-Errors-In-Stream"] = "1"
            claude.turns = 1
        assert claude.say("FACT a=1 RECALL a") == "a=1"
    bodies = [r["body"] for r in messages_requests(sim_reset)]
    assert bodies[0]["max_tokens"] == 4090
    lowered = [b["max_tokens"] for b in bodies if b["max_tokens"] != 4090]
    assert len(lowered) == 2
    assert all(0 < n < 4096 for n in lowered)
    assert stats(sim_reset)["overflows"] == 2


def test_summaries_on_the_messages_api(sim_reset: str, start_proxy: Callable[..., str]) -> None:
    """``upstream.summarizer_api: messages``: an upstream that serves only Anthropic's API
    summarizes on it too, the caller's key and ``anthropic-version`` with each call."""
    # A transcript, which goes to upstream.summarizer_api (a summary asked as the turn's
    # own request goes on the turn's API whatever that says).
    base = small_window_settings(sim_reset, summary_prompt="transcript")
    proxy = start_proxy(
        base.model_copy(
            update={"upstream": base.upstream.model_copy(update={"summarizer_api": "messages"})}
        )
    )
    claude = Claude(proxy, session="summaries-on-messages")
    planted_conversation(claude, 30)
    assert claude.say("RECALL k0 RECALL k10 RECALL k20") == "k0=v0 k10=v70 k20=v140"
    calls = [r for r in upstream_requests(sim_reset) if r["headers"].get("x-compaction-purpose")]
    assert calls
    for call in calls:
        assert call["body"]["system"].startswith("You compact a conversation")
        assert [m["role"] for m in call["body"]["messages"]] == ["user"]
        assert call["headers"]["anthropic-version"]
        assert call["headers"]["authorization"] == f"Bearer {claude.key}"
    assert stats(sim_reset)["rejected_structure"] == 0


def test_the_proxys_own_errors_are_in_anthropics_shape(proxy4k: str, sim_reset: str) -> None:
    sdk = anthropic.Anthropic(base_url=proxy4k, api_key="sk-ant-x", max_retries=0)
    OPEN_CLIENTS.append(sdk)
    huge = "word " * 6000  # alone over the 4k window: the proxy refuses it
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(
            model="sim-4k",
            max_tokens=100,
            messages=[{"role": "user", "content": huge}],
            extra_headers={"X-Sim-Context-Window": "4096"},
        )
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "newest message alone" in body["error"]["message"]
