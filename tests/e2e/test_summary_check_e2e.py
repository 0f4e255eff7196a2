"""Issue 21 items 2 and 4 end to end: the real proxy over HTTP in front of the simulator
playing a weak summarizer (``summary_style``: echo, short, cut_off, parrot), or one that keeps
every fact in prose and writes none of the requested headings (plain), which is kept.
The checks as values: tests/core/test_summary_check.py.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from proxy.core.prompts import CORE, FULL, SIMPLE
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig, SummaryStyle
from tests.support.chat import FILLER, Chat, upstream_requests
from tests.support.servers import run_server
from tests.support.summaries import settings


@pytest.fixture
def weak_sim() -> Iterator[Callable[[SummaryStyle], str]]:
    with ExitStack() as stack:

        def start(style: SummaryStyle) -> str:
            rule = ModelRule(match="sim-4k", summary_style=style)
            return stack.enter_context(
                run_server(create_simulator_app(SimulatorConfig(models=(rule,))))
            )

        yield start


def rejected(url: str, reason: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(
        rf'^compaction_proxy_summaries_rejected_total{{reason="{reason}"}} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def summary_calls(sim: str) -> list[dict[str, Any]]:
    return [
        r for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") == "summarize"
    ]


def talk_past_the_trigger(chat: Chat, turns: int = 40) -> None:
    for turn in range(turns):
        chat.say(f"Turn {turn}: {FILLER}")
        if chat.statuses["trimmed"] >= 3:
            return


def instructions(call: dict[str, Any], prompt: str) -> str:
    """The instructions a summary call carried: its system message with a transcript, its
    last message when asked as the turn's own request (summary_prompt: cached)."""
    messages = call["body"]["messages"]
    return str(messages[0 if prompt == "transcript" else -1]["content"])


@pytest.mark.parametrize("prompt", ["cached", "transcript"])
@pytest.mark.parametrize(
    ("style", "reason"), [("echo", "echo"), ("short", "too_short"), ("parrot", "copied")]
)
def test_a_weak_summarizers_answer_is_rejected_retried_once_and_never_stored(
    weak_sim: Callable[[SummaryStyle], str],
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    style: SummaryStyle,
    reason: str,
    prompt: str,
) -> None:
    sim = weak_sim(style)
    url = start_proxy(settings(sim, summary_prompt=prompt))
    chat = Chat(url, session=f"weak-{style}")
    with caplog.at_level(logging.INFO, logger="proxy.compaction"):
        talk_past_the_trigger(chat)
    assert chat.statuses["trimmed"] >= 1
    assert chat.statuses["compacted"] == 0
    stored = httpx.get(
        f"{url}/sessions/weak-{style}", headers={"Authorization": "Bearer sk-tenant-a"}
    )
    assert stored.status_code == 200, stored.text
    assert (stored.json()["version"], stored.json()["summary"]) == (0, None)
    calls = summary_calls(sim)
    # One compaction's two answers: the first with the instructions, then the simple prompt;
    # then the session backs off (compaction.backoff.first_s): no call on later turns.
    asked = [instructions(c, prompt) for c in calls]
    if prompt == "transcript":
        assert asked == [CORE.system, SIMPLE.system]
    else:
        assert asked == [CORE.cached, SIMPLE.cached]
    assert rejected(url, reason) == 2
    # Logged without content: the reasons only.
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert lines
    assert all(FILLER[:20] not in line and "compact" not in line for line in lines)
    first = calls[0]["body"]["messages"][-1]["content"]
    assert "previous_summary" not in first
    assert "first compaction" not in first


def test_a_summarizer_that_always_runs_to_length_is_counted_as_truncated(
    weak_sim: Callable[[SummaryStyle], str], start_proxy: Callable[..., str]
) -> None:
    sim = weak_sim("cut_off")
    url = start_proxy(settings(sim))
    chat = Chat(url, session="cut")
    talk_past_the_trigger(chat)
    assert chat.statuses["compacted"] == 0
    assert chat.statuses["trimmed"] >= 1
    assert rejected(url, "truncated") == 2  # the answer and its terser retry
    stored = httpx.get(f"{url}/sessions/cut", headers={"Authorization": "Bearer sk-tenant-a"})
    assert stored.json()["version"] == 0


def test_a_good_summarizer_still_passes_with_the_headings_it_was_asked_for(
    weak_sim: Callable[[SummaryStyle], str], start_proxy: Callable[..., str]
) -> None:
    sim = weak_sim("ideal")
    url = start_proxy(settings(sim))
    chat = Chat(url, session="good")
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}{' FACT port=8443' if turn == 1 else ''}")
        if chat.statuses["compacted"]:
            break
    assert chat.statuses["compacted"] == 1
    summary = httpx.get(f"{url}/sessions/good", headers={"Authorization": "Bearer sk-tenant-a"})
    text = summary.json()["summary"]
    assert all(f"## {s}" in text for s in CORE.sections)
    assert "port=8443" in text
    assert all(rejected(url, r) == 0 for r in ("echo", "copied", "too_short", "empty"))


def test_a_raised_budget_share_asks_a_small_window_for_a_longer_fuller_summary(
    weak_sim: Callable[[SummaryStyle], str], start_proxy: Callable[..., str]
) -> None:
    sim = weak_sim("ideal")
    # Without the key: 15% of the 4k window caps summary_max_tokens' 2000 at 614.
    url = start_proxy(settings(sim, summary_max_tokens=2000, summary_budget_ratio=0.25))
    chat = Chat(url, session="share")
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}")
        if chat.statuses["compacted"]:
            break
    calls = summary_calls(sim)
    assert calls
    assert {c["body"]["max_tokens"] for c in calls} == {1024}
    # The full prompt, as a transcript's: the prefix with this budget does not fit the window.
    assert instructions(calls[0], "transcript") == FULL.system


# How the client states its facts: the simulator's reader finds each (replies.py).
PHRASINGS = (
    "FACT {k}={v}",
    "Please note: {k} is {v}.",
    "{k}: {v}, keep that in mind.",
    "We agreed that {k} = {v} for now.",
    "{k} was set to {v} this morning.",
    "For the record, {k} is now {v}.",
)


def test_a_summarizer_that_keeps_every_fact_but_writes_no_headings_is_kept(
    weak_sim: Callable[[SummaryStyle], str], start_proxy: Callable[..., str]
) -> None:
    """120 turns, 40 facts in six wordings, a 4k window, a summarizer that ignores the
    layout it is asked for: both its answers were rejected as ``structure``, the session
    backed off past the conversation's end, and the trimmed view's digest filled itself
    with the ids of the assistant's acknowledgements: 11 of 40 facts came back."""
    sim = weak_sim("plain")
    url = start_proxy(settings(sim))
    chat = Chat(url, session="plain")
    facts: dict[str, str] = {}
    for turn in range(120):
        text = f"Turn {turn}: {FILLER}"
        if turn % 3 == 0:
            key, value = f"k{turn}", f"v{turn * 7}x"
            facts[key] = value
            text += " " + PHRASINGS[turn // 3 % len(PHRASINGS)].format(k=key, v=value)
        chat.say(text)
        # An assistant that acknowledges each turn under an id of its own.
        chat.history[-1]["content"] = f"Noted, recorded as TURN-{turn}."
    recalled = [k for k, v in facts.items() if chat.say(f"RECALL {k}") == f"{k}={v}"]
    assert recalled == list(facts), f"{len(recalled)}/{len(facts)}"
    assert chat.statuses["compacted"] >= 3
    stored = httpx.get(f"{url}/sessions/plain", headers={"Authorization": "Bearer sk-tenant-a"})
    assert stored.status_code == 200, stored.text
    snapshot = stored.json()
    assert snapshot["version"] >= 3
    summary = snapshot["summary"]
    assert summary.startswith("## Summary\n")  # framed under the proxy's heading
    assert not any(f"## {s}" in summary for s in CORE.sections)
    assert all(rejected(url, r) == 0 for r in ("echo", "copied", "too_short", "empty"))
    assert chat.statuses["trimmed"] == 0
