"""Nothing lost between summaries (issue 8): no truncated summary is ever kept, identifiers
a summary drops are restored, and a scheduled compaction is the session's, on any replica."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig, SummaryStyle
from tests.support.chat import FILLER, Chat, upstream_requests
from tests.support.metrics import exact_metric
from tests.support.servers import RedisServer, proxy_settings, run_server

WINDOW = 4096
RESERVE = 256  # the chat model's reply reserve: far less than a full summary


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., str]]:
    from contextlib import ExitStack

    with ExitStack() as stack:

        def start(style: SummaryStyle = "realistic", forgets: int = 0) -> str:
            rule = ModelRule(match="sim-4k", summary_style=style, summary_forgets=forgets)
            app = create_simulator_app(SimulatorConfig(models=(rule,)))
            return stack.enter_context(run_server(app))

        yield start


def settings(sim: str, **compaction: Any) -> Any:
    return proxy_settings(
        sim,
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": RESERVE}],
        compaction={"precompact_ratio": None, **compaction},  # inline: turns say compacted
    )


def play(chat: Chat, turns: int, every: int = 3) -> dict[str, str]:
    facts: dict[str, str] = {}
    for turn in range(turns):
        fact = ""
        if turn % every == 0:
            facts[f"k{turn}"] = f"v{turn * 7}x"
            fact = f" FACT k{turn}={facts[f'k{turn}']}"
        chat.say(f"Turn {turn}: {FILLER}{fact}")
    return facts


def recalled(chat: Chat, facts: dict[str, str]) -> list[str]:
    return [k for k, v in facts.items() if chat.say(f"RECALL {k}") == f"{k}={v}"]


def summary_calls(sim: str) -> list[dict[str, Any]]:
    return [
        r for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") == "summarize"
    ]


def test_a_summary_is_sized_by_the_summary_budget_not_the_reply_reserve(
    sim_factory: Callable[..., str], start_proxy: Callable[..., str]
) -> None:
    """A realistic summarizer writes its critical values last; capped at the chat model's
    256-token reply reserve it was cut off there, and the cut summary was kept."""
    sim = sim_factory("realistic")
    url = start_proxy(settings(sim, summary_max_tokens=600))
    chat = Chat(url, session="sized")
    facts = play(chat, 70)
    assert chat.statuses["compacted"] >= 3
    assert recalled(chat, facts) == list(facts)
    calls = summary_calls(sim)
    assert calls
    assert {c["body"]["max_tokens"] for c in calls} == {600}  # 15% of 4096 is 614
    assert exact_metric(url, "compaction_proxy_summaries_truncated_total") == 0


def test_a_summary_that_cannot_fit_is_never_kept(
    sim_factory: Callable[..., str], start_proxy: Callable[..., str]
) -> None:
    """With a budget too small for the facts even when terse: the turn is trimmed and
    the stored snapshot, if any, is a complete one."""
    sim = sim_factory("realistic")
    url = start_proxy(settings(sim, summary_max_tokens=128))
    chat = Chat(url, session="tight")
    play(chat, 60, every=1)  # a fact every turn: far more than 128 tokens of them
    assert exact_metric(url, "compaction_proxy_summaries_truncated_total") >= 1
    assert exact_metric(url, "compaction_proxy_summary_length_retries_total") >= 1
    assert chat.statuses["trimmed"] >= 1
    calls = summary_calls(sim)
    terse = [c for c in calls if "tersely" in c["body"]["messages"][-1]["content"]]
    assert terse  # each cut-off answer was retried once, asking for less
    stored = httpx.get(f"{url}/sessions/tight", headers={"Authorization": "Bearer sk-tenant-a"})
    summary = stored.json()["summary"] if stored.status_code == 200 else None
    if summary is not None:  # seen, and a summary stored: a complete one
        # A summary that was cut off never ends the critical values mid-way.
        assert "## Critical values" in summary


def test_identifiers_a_summary_forgets_are_restored(
    sim_factory: Callable[..., str],
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The summarizer drops every third fact each time; the proxy's check puts them back."""
    sim = sim_factory("ideal", forgets=3)
    url = start_proxy(settings(sim, summary_max_tokens=600))
    chat = Chat(url, session="lossy")
    with caplog.at_level(logging.INFO, logger="proxy.compaction"):
        facts = play(chat, 90)
    assert chat.statuses["compacted"] >= 4
    assert recalled(chat, facts) == list(facts)
    restored = exact_metric(url, "compaction_proxy_identifiers_restored_total")
    assert restored >= 1
    logged = [
        r.__dict__["fields"]["restored_identifiers"]
        for r in caplog.records
        if r.getMessage() == "compaction"
    ]
    assert sum(logged) == restored


@pytest.mark.redis
def test_a_scheduled_compaction_is_seen_by_every_replica(
    sim_reset: str, start_proxy: Callable[..., str], redis_server: RedisServer
) -> None:
    shared = {"store": {"url": redis_server.url}}
    a = start_proxy(_with(settings(sim_reset, summary_max_tokens=400), shared))
    b = start_proxy(_with(settings(sim_reset, summary_max_tokens=400), shared))
    chat = Chat(a, session="shared")
    while not chat.statuses["compacted"]:
        chat.say(f"Turn {len(chat.history)}: {FILLER}")
        assert len(chat.history) < 200
    chat.say("one more")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "snapshot"
    auth = {"Authorization": "Bearer sk-tenant-a"}
    assert httpx.post(f"{a}/sessions/shared/compact", headers=auth).status_code == 202
    on_b = Chat(b, session="shared")
    on_b.history = chat.history
    on_b.say("continue on the other replica")
    assert on_b.last is not None
    assert on_b.last["x-compaction-status"] == "compacted"
    on_b.say("and once more")
    assert on_b.last["x-compaction-status"] == "snapshot"  # used up, everywhere


def _with(settings: Any, sections: dict[str, Any]) -> Any:
    return settings.model_copy(
        update={k: getattr(settings, k).model_copy(update=v) for k, v in sections.items()}
    )
