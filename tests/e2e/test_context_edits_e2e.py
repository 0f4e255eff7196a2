"""Issue 37 item 7: Anthropic's ``context_management`` edits carried out by the proxy for an
upstream that lacks them (the simulator: it ignores ``context_management`` and refuses a
``compaction`` block, as llama.cpp or vLLM would), end to end with the ``anthropic`` SDK's
beta client: ``clear_thinking_20251015`` and ``clear_tool_uses_20250919`` applied to the
view sent, ``applied_edits`` in the answer (JSON and stream); ``compact_20260112`` as the
proxy's own compaction at the edit's trigger, its summary a ``compaction`` block the next
request sends back, and ``pause_after_compaction``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from proxy.routes.context_edits import PLACEHOLDER
from tests.support.chat import FILLER, stats, upstream_requests
from tests.support.messages import SYSTEM, THINKING, TOOLS, Claude
from tests.support.servers import OPEN_CLIENTS, proxy_settings, run_server

BIG = 200_000
CLEARING = ["context-management-2025-06-27"]
COMPACTING = ["compact-2026-01-12"]


@pytest.fixture
def proxy200k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    models = [{"match": "sim-4k", "context_window": BIG, "max_output_tokens": 4096}]
    return start_proxy(proxy_settings(sim_reset, models=models))


@pytest.fixture
def big(start_proxy: Callable[..., str]) -> Iterator[tuple[str, str]]:
    """A proxy before a simulator whose ``sim-200k`` has a 200k window (a summary call
    carries no X-Sim header to say so): the proxy's URL and the simulator's."""
    from proxy.simulator import create_simulator_app
    from proxy.simulator.config import ModelRule, SimulatorConfig

    rule = ModelRule(match="sim-200k", context_window=BIG, max_output_tokens=4096)
    with run_server(create_simulator_app(SimulatorConfig(models=[rule]))) as sim:
        models = [{"match": "sim-200k", "context_window": BIG, "max_output_tokens": 4096}]
        yield start_proxy(proxy_settings(sim, models=models)), sim


def _sdk(base: str) -> anthropic.Anthropic:
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-ant-tenant-a", max_retries=0)
    OPEN_CLIENTS.append(sdk)
    return sdk


def _forwarded(sim: str) -> list[dict[str, Any]]:
    return [
        r["body"]
        for r in upstream_requests(sim)
        if r["headers"].get("x-compaction-purpose") != "summarize" and "system" in r["body"]
    ]


def _tool_loops(base: str, loops: int) -> list[dict[str, Any]]:
    """A history of ``loops`` user turns each answered through one tool call, under
    extended thinking (the simulator's signed thinking blocks)."""
    claude = Claude(base, headers={"X-Sim-Context-Window": str(BIG)})
    for turn in range(loops):
        claude.say(f"Turn {turn}: {FILLER} CALL 1")
    return claude.history


@pytest.mark.parametrize("stream", [False, True])
def test_clearing_edits_applied_to_the_view_sent(
    proxy200k: str, sim_reset: str, stream: bool
) -> None:
    history = _tool_loops(proxy200k, 5)
    history.append({"role": "user", "content": "And now?"})
    management = {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 500},
                "keep": {"type": "tool_uses", "value": 2},
            },
        ]
    }
    args: dict[str, Any] = {
        "model": "sim-4k",
        "max_tokens": 256,
        "system": SYSTEM,
        "messages": history,
        "tools": TOOLS,
        "thinking": THINKING,
        "betas": CLEARING,
        "context_management": management,
        "extra_headers": {"X-Sim-Context-Window": str(BIG)},
    }
    sdk = _sdk(proxy200k)
    before = len(_forwarded(sim_reset))
    if stream:
        with sdk.beta.messages.stream(**args) as events:
            message = events.get_final_message()
    else:
        message = sdk.beta.messages.create(**args)
    assert message.context_management is not None
    applied = {e.type: e for e in message.context_management.applied_edits}
    tools = applied["clear_tool_uses_20250919"]
    assert tools.cleared_tool_uses == 3
    assert tools.cleared_input_tokens > 0
    thinking = applied["clear_thinking_20251015"]
    assert thinking.cleared_thinking_turns == 4
    assert thinking.cleared_input_tokens > 0
    sent = _forwarded(sim_reset)[before:]
    assert len(sent) == 1
    body = sent[0]
    assert "context_management" not in body  # an upstream without it never sees it
    results = [
        b
        for m in body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert [r["content"] == PLACEHOLDER for r in results] == [True, True, True, False, False]
    thought = [
        any(b["type"] == "thinking" for b in m["content"])
        for m in body["messages"]
        if m["role"] == "assistant"
    ]
    # Five turns of one tool loop each (two assistant messages): the newest keeps its
    # thinking in both, as the API requires of a tool loop's.
    assert thought == [False] * 8 + [True, True]
    assert stats(sim_reset)["rejected_structure"] == 0


def _long_history(facts: int) -> list[dict[str, Any]]:
    """About 60k tokens of turns, a fact planted in each of the first ``facts``."""
    history: list[dict[str, Any]] = []
    for turn in range(40):
        fact = f" FACT k{turn}=v{turn * 7}" if turn < facts else ""
        history.append({"role": "user", "content": f"Turn {turn}: {FILLER * 24}{fact}"})
        history.append({"role": "assistant", "content": [{"type": "text", "text": "Noted."}]})
    return history


def _compacting(history: list[dict[str, Any]], **edit: Any) -> dict[str, Any]:
    return {
        "model": "sim-200k",
        "max_tokens": 256,
        "system": SYSTEM,
        "messages": history,
        "betas": COMPACTING,
        "context_management": {
            "edits": [
                {
                    "type": "compact_20260112",
                    "trigger": {"type": "input_tokens", "value": 50_000},
                    **edit,
                }
            ]
        },
    }


@pytest.mark.parametrize("stream", [False, True])
def test_compact_edit_answers_a_compaction_block_the_next_request_sends_back(
    big: tuple[str, str], stream: bool
) -> None:
    proxy, sim = big
    sdk = _sdk(proxy)
    history = _long_history(5)
    history.append({"role": "user", "content": "What next?"})
    args = _compacting(history)
    if stream:
        with sdk.beta.messages.stream(**args) as events:
            status = events.response.headers["x-compaction-status"]
            message = events.get_final_message()
    else:
        raw = sdk.beta.messages.with_raw_response.create(**args)
        status, message = raw.headers["x-compaction-status"], raw.parse()
    assert status == "compacted"
    kinds = [b.type for b in message.content]
    assert kinds[0] == "compaction"
    assert "text" in kinds[1:]
    block = message.content[0]
    assert block.content
    assert block.encrypted_content
    sent = _forwarded(sim)[-1]
    assert len(sent["messages"]) < len(history) // 2  # the proxy's compacted view went up
    # The client appends the answer as it came, the block first, and asks on.
    history.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
    )
    history.append({"role": "user", "content": "RECALL k2"})
    again = sdk.beta.messages.with_raw_response.create(**_compacting(history))
    assert again.headers["x-compaction-status"] == "passthrough"  # far below, once expanded
    answer = again.parse()
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].text == "k2=v14"  # type: ignore[union-attr]
    expanded = _forwarded(sim)[-1]
    kinds_sent = {b["type"] for m in expanded["messages"] for b in _blocks(m)}
    assert "compaction" not in kinds_sent  # the simulator would refuse one
    assert expanded["messages"][: len(sent["messages"])] == sent["messages"]
    assert stats(sim)["rejected_structure"] == 0


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def test_pause_after_compaction_answers_the_block_alone(big: tuple[str, str]) -> None:
    proxy, sim = big
    sdk = _sdk(proxy)
    history = _long_history(5)
    history.append({"role": "user", "content": "What next?"})
    before = len(_forwarded(sim))
    message = sdk.beta.messages.create(**_compacting(history, pause_after_compaction=True))
    assert message.stop_reason == "compaction"
    assert [b.type for b in message.content] == ["compaction"]
    assert len(_forwarded(sim)) == before  # no generation upstream, a summary only
    assert stats(sim)["summaries"] >= 1
    history.append({"role": "assistant", "content": [message.content[0].model_dump()]})
    history.append({"role": "user", "content": "RECALL k4"})
    answer = sdk.beta.messages.create(**_compacting(history))
    assert answer.content[0].text == "k4=v28"  # type: ignore[union-attr]


def test_edits_checked_as_the_api_checks_them(big: tuple[str, str]) -> None:
    proxy, sim = big
    sdk = _sdk(proxy)
    history = [{"role": "user", "content": "hi"}]
    args = _compacting(history)
    args["context_management"]["edits"][0]["trigger"]["value"] = 1000
    with pytest.raises(anthropic.BadRequestError) as low:
        sdk.beta.messages.create(**args)
    assert low.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "50000" in low.value.body["error"]["message"]  # type: ignore[index]
    forged = {"type": "compaction", "content": "x", "encrypted_content": "cps1.forged"}
    with pytest.raises(anthropic.BadRequestError):
        sdk.beta.messages.create(
            **_compacting(
                [
                    *history,
                    {"role": "assistant", "content": [forged]},
                    {"role": "user", "content": "go on"},
                ]
            )
        )
    assert _forwarded(sim) == []


def test_passthrough_leaves_them_to_the_upstream(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """``upstream.compaction: passthrough`` (``auto`` before api.anthropic.com): clearing
    edits go upstream as sent, a ``compact_*`` edit's request untouched."""
    proxy = start_proxy(proxy_settings(sim_reset, upstream={"compaction": "passthrough"}))
    sdk = _sdk(proxy)
    statuses = {}
    for edit in ("clear_thinking_20251015", "compact_20260112"):
        raw = sdk.messages.with_raw_response.create(
            model="sim-4k",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"context_management": {"edits": [{"type": edit}]}},
        )
        statuses[edit] = raw.headers["x-compaction-status"]
    assert statuses == {"clear_thinking_20251015": "passthrough", "compact_20260112": "bypassed"}
    forwarded = [r["body"]["context_management"] for r in upstream_requests(sim_reset)]
    assert [e["edits"][0]["type"] for e in forwarded] == list(statuses)
