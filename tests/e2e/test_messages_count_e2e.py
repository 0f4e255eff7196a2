"""Issue 25 item 1's last gap: ``POST /v1/messages/count_tokens`` relayed untouched, its
answer carrying what the session's compacted view would cost (``X-Compaction-View-*``),
end to end: the official ``anthropic`` SDK, a real proxy, the simulator upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.chat import FILLER, small_window_settings
from tests.support.messages import SYSTEM, THINKING, TOOLS, Claude, with_breakpoint


@pytest.fixture
def proxy4k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return start_proxy(small_window_settings(sim_reset))


def _request(claude: Claude) -> dict[str, Any]:
    """What ``claude``'s next request sends, its output budget aside."""
    return {
        "model": "sim-4k",
        "system": SYSTEM,
        "messages": with_breakpoint(claude.history),
        "tools": TOOLS,
        "thinking": THINKING,
    }


def test_count_tokens_says_what_the_compacted_view_costs(proxy4k: str, sim_reset: str) -> None:
    claude = Claude(proxy4k, session="count-view")
    turn = 0
    while not claude.statuses["compacted"]:
        assert turn < 40, "the conversation should compact"
        claude.say(f"Turn {turn}: {FILLER}" + (" CALL 1" if turn % 4 == 3 else ""))
        turn += 1
    claude.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
    headers = {"X-Session-Id": "count-view", "X-Sim-Context-Window": "4096"}
    request = _request(claude)
    counted = claude.client.messages.with_raw_response.count_tokens(
        **request, extra_headers=headers
    )
    whole = counted.parse().input_tokens
    # The body went upstream untouched: the simulator counts it alike when asked itself.
    direct = httpx.post(f"{sim_reset}/v1/messages/count_tokens", json=request, headers=headers)
    assert direct.json()["input_tokens"] == whole
    view = int(counted.headers["x-compaction-view-tokens"])
    version = int(counted.headers["x-compaction-view-version"])
    assert counted.headers["x-compaction-view-status"] == "snapshot"
    assert version >= 1
    assert view < whole
    # The next request of that history: its view is the one counted, to the token (same
    # counter, same snapshot, same rebuild; the output budget is not in either figure).
    created = claude.client.messages.with_raw_response.create(
        **request, max_tokens=claude.max_tokens, extra_headers=headers
    )
    assert created.headers["x-compaction-status"] == "snapshot"
    assert int(created.headers["x-compaction-version"]) == version
    assert int(created.headers["x-context-tokens"]) == view
    usage = created.parse().usage
    sent = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert sent + (usage.cache_creation_input_tokens or 0) < whole


def test_count_tokens_without_a_snapshot_or_with_compaction_off(
    proxy4k: str, sim_reset: str
) -> None:
    """No snapshot: the history as sent, counted (version 0); ``X-Compaction: off`` (the
    next request untouched) says ``bypassed``; a body the proxy cannot read gets the
    upstream's answer, without the headers."""
    claude = Claude(proxy4k)
    claude.say(f"Turn 0: {FILLER}")
    claude.history.append({"role": "user", "content": "Turn 1"})
    request = _request(claude)
    figures = set()
    for control, status in (("", "passthrough"), ("off", "bypassed")):
        counted = claude.client.messages.with_raw_response.count_tokens(
            **request, extra_headers={"X-Compaction": control} if control else {}
        )
        assert counted.headers["x-compaction-view-status"] == status
        assert counted.headers["x-compaction-view-version"] == "0"
        figures.add(int(counted.headers["x-compaction-view-tokens"]))
        assert counted.parse().input_tokens > 0
    # The history as sent, in the proxy's count either way (the proxy counts thinking
    # blocks with their signatures as JSON, the simulator does not: its figure differs).
    (figure,) = figures
    assert figure > 0
    bad = httpx.post(
        f"{proxy4k}/v1/messages/count_tokens",
        json={"model": "sim-4k", "messages": []},
        headers={"x-api-key": claude.key},
    )
    assert bad.status_code == 400
    assert "x-compaction-view-tokens" not in bad.headers
