"""Compactions timed to the cache (issue 39 item 2): with ``compaction.cache_aware`` a
snapshot made in the background waits while the session's prompt cache is warm, and is
applied on the first turn after the session idled past the cache's TTL, when the prefix
is paid in full anyway. The real proxy under uvicorn, the openai SDK as client, the
simulator as upstream with a prompt cache of seconds (the proxy's pricing says the same
TTL); background pre-compaction at 0.6 of the window, each turn waiting for the run it
started, so a snapshot is ready by the next turn.

Each turn's cache outcome on the proxy's ledger (its request line) is the simulator's
own judgement of its cache (its billing record), every figure of the entry with it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import httpx
import pytest

from proxy.config import Settings
from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.support.chat import FILLER, WINDOW, Chat, chat_requests, small_window_settings
from tests.support.ledger import PRICE, chat_measure, ledger_fields
from tests.support.ledger import expected as expected_entries
from tests.support.logs import request_lines
from tests.support.metrics import metric, wait_for_idle
from tests.support.servers import run_server

pytestmark = pytest.mark.e2e

TTL = 3.0  # seconds, the simulator's cache and the proxy's pricing alike
IDLE = TTL + 1.5
WARM_TURNS = 3  # turns served the held view before the session idles
MAX_TURNS = 40  # bound on the turns it takes a background snapshot to be held


@pytest.fixture(scope="module")
def short_cache() -> Iterator[str]:
    config = SimulatorConfig.model_validate({"prompt_cache": {"ttl_s": TTL}})
    with run_server(create_simulator_app(config)) as url:
        yield url


def _proxy(sim: str, start_proxy: Callable[..., str]) -> str:
    settings = small_window_settings(sim, precompact_ratio=0.6, cache_aware=True).model_dump()
    settings["pricing"] = [{**PRICE, "cache_ttl_s": TTL}]
    return start_proxy(Settings(**settings))


def _turn(chat: Chat, url: str, turn: int, histories: list[list[dict[str, Any]]]) -> str | None:
    """One turn, the background run it started finished; its cache plan header."""
    chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
    histories.append([dict(m) for m in chat.history])
    chat.history.append({"role": "assistant", "content": chat.send().content})
    wait_for_idle(url)
    assert chat.last is not None
    return chat.last.get("x-compaction-cache-plan")


def _foreground(entry: dict[str, Any]) -> dict[str, Any]:
    """A turn's expected entry with no summary in it: this session's summaries ran in the
    background, after the turn's line was written (observe/ledger.py ``late``)."""
    bare = {**entry, "summarizer_input": 0, "summarizer_output": 0, "summarizer_cached": 0}
    return {**bare, "net": entry["would_send"] - entry["sent"]}


def _extends(requests: list[dict[str, Any]]) -> list[bool]:
    """Per forwarded request after the first: whether it starts with the previous one."""
    sent = [r["body"]["messages"] for r in requests]
    return [b[: len(a)] == a for a, b in pairwise(sent)]


def test_a_snapshot_waits_while_the_cache_is_warm_and_lands_after_an_idle(
    short_cache: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    httpx.delete(f"{short_cache}/_sim/requests")  # its prompt cache too: a cold start
    url = _proxy(short_cache, start_proxy)
    chat = Chat(url, key="sk-timed", session="timed")
    histories: list[list[dict[str, Any]]] = []
    plans: list[str | None] = []
    versions: list[int] = []
    with request_lines(caplog) as lines:
        turn = 0
        while plans.count("held") < WARM_TURNS:  # a background snapshot, held while warm
            assert turn < MAX_TURNS, plans
            plans.append(_turn(chat, url, turn, histories))
            versions.append(int(chat.last["x-compaction-version"]))  # type: ignore[index]
            turn += 1
        held_from = plans.index("held")
        time.sleep(IDLE)  # the session idles past its cache's TTL
        idle = turn
        for turn in range(idle, idle + 4):
            plans.append(_turn(chat, url, turn, histories))
            versions.append(int(chat.last["x-compaction-version"]))  # type: ignore[index]
    requests = chat_requests(short_cache)
    assert len(requests) == len(histories) == idle + 4
    outcomes = [r["cache"] for r in requests]
    extended = _extends(requests)  # extended[i - 1]: request i starts with request i - 1
    stored = httpx.get(f"{url}/sessions/timed", headers={"Authorization": "Bearer sk-timed"})
    newest = stored.json()["version"]
    assert newest > 0
    # While the cache was warm the newer snapshot waited: the view served was the one
    # served before it, byte for byte, each turn a hit in the simulator's cache.
    for i in range(held_from, idle):
        assert versions[i] == versions[held_from - 1] < newest, (i, versions)
        assert extended[i - 1], i
        assert outcomes[i] == "hit", (i, outcomes)
        assert plans[i] == "held", (i, plans)
        assert requests[i]["usage"]["prompt_tokens"] < 0.8 * WINDOW  # below the trigger
    # The turn after the idle: the cache had expired, so the snapshot was applied then.
    assert versions[idle] == newest, versions
    assert not extended[idle - 1], "the view did not move on the turn after the idle"
    assert outcomes[idle] == "ttl_expiry", outcomes
    assert plans[idle] == "expired", plans
    # ...and the turns after it repeat its prefix, warm again.
    for i in range(idle + 1, idle + 4):
        assert versions[i] == newest, (i, versions)
        assert extended[i - 1], i
        assert outcomes[i] == "hit", (i, outcomes)
    # The cut moved once, and no warm cache was thrown away for it.
    assert "prefix_change" not in outcomes, outcomes
    # The ledger's outcome of every turn is the simulator's, every figure with it (the
    # summaries ran in the background, after their turn's line: its session's totals).
    expected = [_foreground(e) for e in expected_entries(short_cache, histories, chat_measure)]
    assert len(lines) == len(expected)
    for i, (line, want) in enumerate(zip(lines, expected, strict=True)):
        got = ledger_fields(line)
        got.pop("money_saved_usd")
        assert got == want, i
        assert line.get("cache_plan") == plans[i], i
    assert [e["cache"] for e in expected] == outcomes
    totals = stored.json()["ledger"]
    summaries = [
        r["usage"]["prompt_tokens"]
        for r in httpx.get(f"{short_cache}/_sim/requests").json()
        if r["headers"].get("x-compaction-purpose") == "summarize"
    ]
    assert summaries
    assert totals["summarizer_input"] == sum(summaries)
    # ...and what the cache served of them (each asked as its turn's own request).
    cached = [
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
        for r in httpx.get(f"{short_cache}/_sim/requests").json()
        if r["headers"].get("x-compaction-purpose") == "summarize"
    ]
    assert totals["summarizer_cached"] == sum(cached) > 0
    assert totals["cache"]["ttl_expiry"] == 1
    assert totals["cache"]["prefix_change"] == 0
    assert metric(url, "compaction_proxy_cache_plans", plan="held") == WARM_TURNS
    assert metric(url, "compaction_proxy_cache_plans", plan="expired") == 1
