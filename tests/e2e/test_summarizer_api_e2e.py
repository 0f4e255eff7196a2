"""The summarizer on the Responses API (``upstream.summarizer_api: responses``), end to
end: the same summaries as on chat completions, a cut-off one detected the same way,
never kept.

In-process: tests/compaction/test_summarizer_api.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig, SummaryStyle
from tests.support.chat import FILLER, Chat, upstream_requests
from tests.support.metrics import exact_metric
from tests.support.servers import proxy_settings, run_server

WINDOW = 4096


def settings(sim: str, **compaction: Any) -> Any:
    return proxy_settings(
        sim,
        upstream={"summarizer_api": "responses"},
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        # inline: turns say compacted; a transcript, which goes to upstream.summarizer_api
        # (a summary asked as the chat turn's own request goes to chat completions)
        compaction={"precompact_ratio": None, "summary_prompt": "transcript", **compaction},
    )


def summary_calls(sim: str) -> list[dict[str, Any]]:
    calls = [
        r for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") == "summarize"
    ]
    for call in calls:  # each in the Responses API's shape, none in chat's
        assert "messages" not in call["body"]
        assert call["body"]["instructions"].startswith("You compact a conversation")
        assert isinstance(call["body"]["input"], str)
        assert call["body"]["store"] is False
    return calls


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., str]]:
    with ExitStack() as stack:

        def start(style: SummaryStyle = "ideal", max_output_tokens: int = 16384) -> str:
            rule = ModelRule(
                match="sim-4k", summary_style=style, max_output_tokens=max_output_tokens
            )
            app = create_simulator_app(SimulatorConfig(models=(rule,)))
            return stack.enter_context(run_server(app))

        yield start


def test_a_summary_on_the_responses_api_keeps_the_planted_fact(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(settings(sim_reset, summary_max_tokens=400))
    chat = Chat(url, session="on-responses")
    for turn in range(60):
        chat.say(f"Turn {turn}: {FILLER}" + (" FACT code=k7q2" if turn == 0 else ""))
    assert chat.statuses["compacted"] >= 2, chat.statuses
    calls = summary_calls(sim_reset)
    assert len(calls) >= 2
    assert {c["body"]["max_output_tokens"] for c in calls} == {400}
    stored = httpx.get(
        f"{url}/sessions/on-responses", headers={"Authorization": "Bearer sk-tenant-a"}
    )
    assert "code=k7q2" in stored.json()["summary"]
    assert chat.say("RECALL code") == "code=k7q2"
    assert exact_metric(url, "compaction_proxy_summaries_truncated_total") == 0


def test_a_summary_cut_off_on_the_responses_api_is_never_kept(
    sim_factory: Callable[..., str], start_proxy: Callable[..., str]
) -> None:
    """``status: incomplete`` (``max_output_tokens``) is chat's ``finish_reason: length``:
    retried once asking for less, then the turn is trimmed and the snapshot kept."""
    sim = sim_factory("realistic")
    url = start_proxy(settings(sim, summary_max_tokens=128))
    chat = Chat(url, session="tight")
    for turn in range(60):  # a fact every turn: far more than 128 tokens of them
        chat.say(f"Turn {turn}: {FILLER} FACT k{turn}=v{turn * 7}x")
    assert exact_metric(url, "compaction_proxy_summaries_truncated_total") >= 1
    assert exact_metric(url, "compaction_proxy_summary_length_retries_total") >= 1
    assert chat.statuses["trimmed"] >= 1
    assert [c for c in summary_calls(sim) if "tersely" in c["body"]["input"]]
    stored = httpx.get(f"{url}/sessions/tight", headers={"Authorization": "Bearer sk-tenant-a"})
    if stored.status_code == 200 and stored.json()["summary"] is not None:
        assert "## Critical values" in stored.json()["summary"]


def test_a_responses_summarizer_that_writes_less_is_asked_again_within_its_limit(
    sim_factory: Callable[..., str], start_proxy: Callable[..., str]
) -> None:
    sim = sim_factory(max_output_tokens=256)
    chat = Chat(start_proxy(settings(sim, summary_max_tokens=400)), session="capped")
    for turn in range(21):
        chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        chat.history.append({"role": "assistant", "content": f"Noted. {FILLER}"})
    chat.say("carry on")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    asked = [c["body"]["max_output_tokens"] for c in summary_calls(sim)]
    assert asked[:2] == [400, 256]
