"""The ledger prices what providers bill, expiry included: a session that idles past its
prompt cache's TTL has that turn's cache outcome ``ttl_expiry`` on the ledger as in the
simulator's billing record, and every turn's outcome and write tier agree with the
simulator's, on chat (OpenAI's cache) and Messages (Anthropic's, at the hour's tier
when the breakpoints ask ``ttl: "1h"``). The TTLs are seconds here, on both sides."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from proxy.config import Settings
from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.support.chat import FILLER, Chat, small_window_settings
from tests.support.ledger import PRICE, chat_measure, ledger_fields, messages_measure
from tests.support.ledger import expected as expected_entries
from tests.support.logs import request_lines
from tests.support.messages import with_breakpoint
from tests.support.servers import OPEN_CLIENTS, run_server

pytestmark = pytest.mark.e2e

TTL, LONG = 3.0, 6.0  # the 5-minute tier's and the hour's, in seconds
IDLE, LONG_IDLE = TTL + 1.5, LONG + 1.5
TURNS = 32
HOUR: dict[str, Any] = {"type": "ephemeral", "ttl": "1h"}


@pytest.fixture(scope="module")
def short_cache() -> Iterator[str]:
    """A simulator whose prompt caches live seconds."""
    lifetimes = {"ttl_s": TTL, "anthropic_ttl_s": TTL, "anthropic_long_ttl_s": LONG}
    config = SimulatorConfig.model_validate({"prompt_cache": lifetimes})
    with run_server(create_simulator_app(config)) as url:
        yield url


@pytest.fixture
def sim(short_cache: str) -> str:
    httpx.delete(f"{short_cache}/_sim/requests")
    return short_cache


def _proxy(sim: str, start_proxy: Callable[..., str]) -> str:
    settings = small_window_settings(sim).model_dump()
    settings["pricing"] = [{**PRICE, "cache_ttl_s": TTL, "cache_long_ttl_s": LONG}]
    return start_proxy(Settings(**settings))


def _check(lines: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    """Each turn's ledger line against the simulator's records; the outcomes."""
    assert len(lines) == len(expected)
    for turn, (line, want) in enumerate(zip(lines, expected, strict=True)):
        got = ledger_fields(line)
        got.pop("money_saved_usd")
        assert got == want, turn
    return [e["cache"] for e in expected]


def test_a_chat_session_idle_past_the_ttl_pays_its_expiry(
    sim: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    url = _proxy(sim, start_proxy)
    chat = Chat(url, session="idle")
    histories, pauses = [], {5: IDLE, 16: IDLE}
    with request_lines(caplog) as lines:
        for turn in range(TURNS):
            time.sleep(pauses.get(turn, 0))
            chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
            histories.append([dict(m) for m in chat.history])
            chat.history.append({"role": "assistant", "content": chat.send().content})
    outcomes = _check(lines, expected_entries(sim, histories, chat_measure))
    assert (outcomes[0], outcomes[5], outcomes[16]) == ("cold_start", "ttl_expiry", "ttl_expiry")
    assert "prefix_change" in outcomes  # a compaction's view: the proxy's own miss
    assert outcomes.count("ttl_expiry") == 2
    totals = httpx.get(
        f"{url}/sessions/idle", headers={"Authorization": f"Bearer {chat.key}"}
    ).json()["ledger"]
    assert totals["cache"]["ttl_expiry"] == 2
    assert totals["cache"]["prefix_change_by_proxy"] == outcomes.count("prefix_change")


def test_a_messages_session_at_the_hours_tier_outlives_the_five_minutes(
    sim: str, start_proxy: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Breakpoints asking ``ttl: "1h"``: written at the hour's tier, still read after an
    idle past the 5-minute TTL, expired after one past the hour's."""
    url = _proxy(sim, start_proxy)
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-expiry", max_retries=0)
    OPEN_CLIENTS.append(client)
    system = [{"type": "text", "text": "You are a careful agent.", "cache_control": HOUR}]
    headers = {"X-Session-Id": "hour", "X-Sim-Context-Window": "4096"}
    history: list[dict[str, Any]] = []
    histories, pauses = [], {4: IDLE, 14: LONG_IDLE}
    with request_lines(caplog) as lines:
        for turn in range(24):
            time.sleep(pauses.get(turn, 0))
            history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
            marked = with_breakpoint(history)
            marked[-1]["content"][-1]["cache_control"] = HOUR
            histories.append(marked)
            answer = client.messages.create(
                model="sim-4k",
                max_tokens=256,
                system=system,  # type: ignore[arg-type]
                messages=marked,  # type: ignore[arg-type]
                extra_headers=headers,
            )
            history.append({"role": "assistant", "content": answer.content[0].text})  # type: ignore[union-attr]
    expected = expected_entries(sim, histories, messages_measure)
    outcomes = _check(lines, expected)
    assert outcomes[4] == "hit"  # past the 5 minutes' TTL, within the hour's
    assert outcomes[14] == "ttl_expiry"
    assert sum(e["written_1h"] for e in expected) > 0
    assert sum(e["written_5m"] for e in expected) == 0
