"""Issue 26 item 1 end to end: does compaction pay? The ledger's arithmetic, per request
and per session, priced and unpriced, checked against what the simulator recorded: its
usage for every call (cached_tokens for a repeated prefix, the summaries' own usage) and
its own count of each history the client sent. The expected figures are computed here,
from those records, never read back from the proxy's answers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from proxy.config import Settings
from proxy.core.cache_outcome import CACHE_OUTCOMES
from proxy.observe.logs import ACCESS
from tests.support.chat import FILLER, Chat, small_window_settings, upstream_requests
from tests.support.ledger import PRICE, ledger_fields, messages_measure
from tests.support.ledger import expected as expected_entries
from tests.support.ledger import money as money_sides
from tests.support.logs import request_lines
from tests.support.messages import SYSTEM, with_breakpoint
from tests.support.metrics import metric, wait_for_idle
from tests.support.responses import settings as responses_settings
from tests.support.servers import OPEN_CLIENTS

ADMIN_KEY = "admin-secret"
TURNS = 32


def _saved(entry: dict[str, Any]) -> float:
    would, paid = money_sides(entry)
    return would - paid


def _converse(url: str, caplog: pytest.LogCaptureFixture) -> tuple[Chat, list[Any], list[Any]]:
    chat = Chat(url, session="ledger")
    histories = []
    with request_lines(caplog) as lines:
        for turn in range(TURNS):
            chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
            histories.append([dict(m) for m in chat.history])
            message = chat.send()
            chat.history.append({"role": "assistant", "content": message.content})
    return chat, histories, lines


@pytest.mark.parametrize("priced", [False, True], ids=["unpriced", "priced"])
def test_the_ledger_adds_up_per_request_and_per_session(
    priced: bool,
    sim_reset: str,
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = small_window_settings(sim_reset).model_dump()
    settings["pricing"] = [PRICE] if priced else []
    settings["server"]["admin_key"] = ADMIN_KEY
    url = start_proxy(Settings(**settings))
    chat, histories, lines = _converse(url, caplog)
    assert chat.statuses["compacted"] >= 1  # a summary, then views that are not the history
    expected = expected_entries(sim_reset, histories)
    assert any(e["cached"] for e in expected)  # the simulator cached a repeated prefix
    assert any(e["summarizer_input"] for e in expected)
    assert len(lines) == len(expected) == TURNS
    for line, want in zip(lines, expected, strict=True):
        got = ledger_fields(line)
        money = got.pop("money_saved_usd", None)
        assert got == want
        if priced:
            assert money == pytest.approx(_saved(want), abs=1e-6)
        else:
            assert money is None
    # The session's totals: the sum of its requests'.
    session = httpx.get(f"{url}/sessions/ledger", headers={"Authorization": f"Bearer {chat.key}"})
    assert session.status_code == 200
    totals = session.json()["ledger"]
    for kind in ("would_send", "sent", "cached", "would_cached", "net"):
        assert totals[kind] == sum(e[kind] for e in expected), kind
    assert totals["summarizer_input"] == sum(e["summarizer_input"] for e in expected)
    assert totals["summarizer_output"] == sum(e["summarizer_output"] for e in expected)
    assert totals["requests"] == TURNS
    assert totals["estimated"] is False
    outcomes = Counter(e["cache"] for e in expected)
    assert totals["cache"] == {
        **dict.fromkeys(CACHE_OUTCOMES, 0),
        **outcomes,
        "prefix_change_by_proxy": outcomes["prefix_change"],
    }
    assert outcomes["hit"]
    assert outcomes["prefix_change"]  # compactions cost the cache
    if priced:
        want_money = sum(_saved(e) for e in expected)
        assert totals["money_saved_usd"] == pytest.approx(want_money, abs=1e-5)
        would, paid = (sum(money_sides(e)[side] for e in expected) for side in (0, 1))
        assert totals["would_have_paid_usd"] == pytest.approx(would, abs=1e-5)
        assert totals["paid_usd"] == pytest.approx(paid, abs=1e-5)
    else:
        assert "money_saved_usd" not in totals
    # The tenant's (one session here) in the admin API, and the series.
    admin = httpx.get(f"{url}/admin/tenants", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert admin.status_code == 200
    (tenant,) = admin.json()["data"]
    assert {**tenant, "scope": "process"} == {**totals, "tenant": tenant["tenant"]}
    for kind in ("would_send", "sent", "cached", "would_cached"):
        want = sum(e[kind] for e in expected)
        assert metric(url, "compaction_proxy_tokens_saved", kind=kind) == want, kind
    for direction in ("input", "output"):
        want = sum(e[f"summarizer_{direction}"] for e in expected)
        assert metric(url, "compaction_proxy_summarizer_tokens", direction=direction) == want
    saved = metric(url, "compaction_proxy_cost_usd", side="would_have_paid") - metric(
        url, "compaction_proxy_cost_usd", side="paid"
    )
    assert saved == pytest.approx(sum(_saved(e) for e in expected) if priced else 0.0, abs=1e-5)
    for outcome, count in outcomes.items():
        cause = "proxy" if outcome == "prefix_change" else "none"
        got = metric(url, "compaction_proxy_cache_outcomes", cause=cause, outcome=outcome)
        assert got == count, outcome


def test_without_usage_the_entry_says_estimated(
    sim_reset: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """A stream without include_usage carries no usage: the proxy's own counts, said so."""
    url = start_proxy(small_window_settings(sim_reset))
    chat = Chat(url, session="streamed")
    chat.history.append({"role": "user", "content": f"Turn 0: {FILLER}"})
    with request_lines(caplog) as lines:
        for options in (None, {"include_usage": True}):
            extra = {"stream_options": options} if options else {}
            for _ in chat.client.chat.completions.create(
                model="sim-4k", messages=chat.history, stream=True, **extra
            ):
                pass
        deadline = time.monotonic() + 60  # a stream's line is written once it has ended
        while len([r for r in caplog.records if r.name == ACCESS.name]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    (bare, usage) = (ledger_fields(line) for line in lines)
    assert bare["estimated"] is True
    assert usage["estimated"] is False
    (_, with_usage) = (r["usage"] for r in upstream_requests(sim_reset))
    assert usage["sent"] == usage["would_send"] == with_usage["prompt_tokens"]


def test_responses_cached_tokens_reach_the_ledger(
    sim_reset: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """The Responses API's ``input_tokens_details.cached_tokens``, in the request's entry."""
    url = start_proxy(responses_settings(sim_reset))
    opening = [
        {"role": "system", "content": "You are terse. " + "alpha beta gamma " * 230},
        {"role": "user", "content": "Remember: " + "delta epsilon zeta " * 230},
    ]
    headers = {"Authorization": "Bearer sk-responses", "X-Session-Id": "r"}
    with request_lines(caplog) as lines:
        for last in ("one", "two"):
            r = httpx.post(
                f"{url}/v1/responses",
                json={"model": "sim-8k", "input": [*opening, {"role": "user", "content": last}]},
                headers=headers,
            )
            assert r.status_code == 200, r.text
    usages = [call["usage"] for call in upstream_requests(sim_reset)]
    assert usages[1]["input_tokens_details"]["cached_tokens"] > 0
    for line, usage in zip(lines, usages, strict=True):
        got = ledger_fields(line)
        sent, cached = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
        assert (got["sent"], got["cached"], got["would_send"]) == (sent, cached, sent)
        assert (got["would_cached"], got["net"], got["estimated"]) == (cached, 0, False)


def test_a_background_summarys_tokens_reach_its_session(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Pre-compaction summarizes after the answer is out: its tokens still count, in the
    session's totals and the series, as the simulator's usage for those calls says."""
    url = start_proxy(small_window_settings(sim_reset, precompact_ratio=0.5))
    chat = Chat(url, session="background")
    for turn in range(24):
        chat.say(f"Turn {turn}: {FILLER}")
    wait_for_idle(url)
    assert metric(url, "compaction_proxy_precompactions", outcome="compacted") >= 1
    summaries = [
        call["usage"]
        for call in upstream_requests(sim_reset)
        if call["headers"].get("x-compaction-purpose") == "summarize"
    ]
    assert summaries
    totals = httpx.get(
        f"{url}/sessions/background", headers={"Authorization": f"Bearer {chat.key}"}
    ).json()["ledger"]
    assert totals["summarizer_input"] == sum(u["prompt_tokens"] for u in summaries)
    assert totals["summarizer_output"] == sum(u["completion_tokens"] for u in summaries)
    given = metric(url, "compaction_proxy_summarizer_tokens", direction="input")
    assert given == totals["summarizer_input"]


def test_messages_usage_reaches_the_ledger(
    sim_reset: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Anthropic's Messages usage: ``cache_read_input_tokens`` is the entry's cached, and
    the prompt the three input counts together, in each request's entry and the session's."""
    url = start_proxy(small_window_settings(sim_reset))
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-ledger", max_retries=0)
    OPEN_CLIENTS.append(client)
    headers = {"X-Session-Id": "ledger-messages", "X-Sim-Context-Window": "4096"}
    history: list[dict[str, Any]] = []
    histories, statuses = [], []
    with request_lines(caplog) as lines:
        for turn in range(TURNS):
            history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
            histories.append(with_breakpoint(history))
            raw = client.messages.with_raw_response.create(
                model="sim-4k",
                max_tokens=256,
                system=SYSTEM,  # type: ignore[arg-type]
                messages=histories[-1],  # type: ignore[arg-type]
                extra_headers=headers,
            )
            statuses.append(raw.headers["x-compaction-status"])
            text = raw.parse().content[0].text  # type: ignore[union-attr]
            history.append({"role": "assistant", "content": text})
    assert "compacted" in statuses
    expected = expected_entries(sim_reset, histories, messages_measure)
    assert any(e["cached"] for e in expected)  # the simulator's cache read a prefix
    assert any(e["summarizer_input"] for e in expected)
    assert len(lines) == len(expected) == TURNS
    for line, want in zip(lines, expected, strict=True):
        got = ledger_fields(line)
        got.pop("money_saved_usd", None)
        assert got == want
    session = httpx.get(
        f"{url}/sessions/ledger-messages", headers={"Authorization": "Bearer sk-ant-ledger"}
    )
    totals = session.json()["ledger"]
    for kind in ("would_send", "sent", "cached", "would_cached", "net"):
        assert totals[kind] == sum(e[kind] for e in expected), kind
