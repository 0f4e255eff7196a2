"""Issue 24 item 3 over real HTTP: a compaction that saves nothing is not a compaction.

A pinned prefix dominates the window (as Codex's ~7,800-token instructions do in a 16k
window): every turn is past the trigger, nothing is bulky enough to elide and a summary
would cost more than the few short turns it replaces. Each turn is then served as it
is: no version bump, no snapshot written, no compaction counted, no summarizer call;
/metrics counts the plans as ``nothing_to_save`` instead.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.support.chat import Chat, chat_requests, stats
from tests.support.metrics import metric
from tests.support.servers import proxy_settings

WINDOW = 4096
# ~3,150 tokens of instructions: with the 256-token reply reserved, past the 3,276
# trigger (0.8) from the first turn, while the turns stay far below a summary's cost.
INSTRUCTIONS = "Follow the house rules for every answer, in order, without exception. " * 250


def test_a_pinned_prefix_that_dominates_the_window_is_never_compacted_for_nothing(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    settings = proxy_settings(
        sim_reset,
        models=[{"match": "sim-*", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None},
    )
    url = start_proxy(settings)
    chat = Chat(url, session="pinned-prefix", window=WINDOW)
    chat.history = [{"role": "system", "content": INSTRUCTIONS}]
    trigger = int(WINDOW * 0.8)
    for turn in range(6):
        chat.say(f"Turn {turn}: a short question.")
        assert chat.last is not None
        # Past the trigger (the header counts input; the reserve adds 256) every turn...
        assert int(chat.last["x-context-tokens"]) + 256 > trigger
        # ...and still served as it is, under no new version.
        assert chat.last["x-compaction-version"] == "0", turn
        assert chat.last["x-compaction-status"] == "passthrough", turn
    assert chat.statuses["compacted"] == 0

    # The upstream saw every message: nothing elided, summarized or dropped.
    sent = chat_requests(sim_reset)
    assert [len(r["body"]["messages"]) for r in sent] == [2, 4, 6, 8, 10, 12]
    assert stats(sim_reset)["summaries"] == 0

    assert metric(url, "compaction_proxy_compactions", outcome="compacted") == 0
    assert metric(url, "compaction_proxy_compactions_by_trigger") == 0
    assert metric(url, "compaction_proxy_compactions", outcome="nothing_to_save") >= 1

    # No snapshot was written: the session is only seen, at version 0 with no summary.
    seen = httpx.get(
        f"{url}/sessions/pinned-prefix", headers={"Authorization": "Bearer sk-tenant-a"}
    )
    assert seen.status_code == 200, seen.text
    info = seen.json()
    assert (info["version"], info["summary"]) == (0, None)
