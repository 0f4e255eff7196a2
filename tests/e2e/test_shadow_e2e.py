"""Issue 26 item 2 end to end: shadow mode. A 60-turn conversation through the proxy
(the ``openai`` SDK, over HTTP, in front of the simulator) is forwarded byte-identical to
what the client sent, every request, while the response headers, the request lines and
the metrics show the compactions the proxy would have made; with ``shadow_summarize``
the summaries it ran are readable through ``GET /sessions/{id}`` and never applied.

The proxy's window for ``sim-4k`` is 4096 tokens, so it plans compactions from about
turn 12; the simulator is told the model's window is 64k, so the untouched histories
never overflow it (an overflow would be recovered by compacting: not shadow's to test).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import redis

from proxy.config import StoreSettings
from tests.support.chat import (
    FILLER,
    Chat,
    assert_forwarded_as_sent,
    recording_chat,
    small_window_settings,
    upstream_requests,
)
from tests.support.logs import request_lines
from tests.support.metrics import metric

TURNS = 60
SIM_WINDOW = 65536


def _converse(chat: Chat) -> list[httpx.Headers]:
    seen = []
    for turn in range(TURNS):
        chat.say(f"Turn {turn}: {FILLER}")
        assert chat.last is not None
        seen.append(chat.last)
    return seen


def _assert_forwarded_as_sent(sim: str, sent: list[bytes]) -> None:
    assert_forwarded_as_sent(sim, sent)
    chats = [
        r for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") != "summarize"
    ]
    assert len(chats) == len(sent) == TURNS


@pytest.mark.parametrize("how", ["mode", "header"])
def test_shadow_forwards_untouched_and_reports_what_it_would_have_sent(
    how: str,
    sim_reset: str,
    start_proxy: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``compaction.mode: shadow``, or ``X-Compaction: shadow`` on every request of a proxy
    whose mode is on: the same behaviour."""
    compaction = {"mode": "shadow"} if how == "mode" else {}
    url = start_proxy(small_window_settings(sim_reset, **compaction))
    headers = {"X-Compaction": "shadow"} if how == "header" else {}
    chat, sent = recording_chat(url, "shadowed", headers, SIM_WINDOW)
    with request_lines(caplog) as lines:
        seen = _converse(chat)
    _assert_forwarded_as_sent(sim_reset, sent)
    assert chat.statuses == {"shadow": TURNS}
    shadow = [h["x-compaction-shadow-status"] for h in seen]
    compacted = shadow.count("compacted")
    assert compacted >= 3  # several compactions, one after another
    assert shadow.count("snapshot") >= 10  # a compaction's snapshot applies until the next
    assert shadow[0] == "passthrough"
    versions = [int(h["x-compaction-shadow-version"]) for h in seen]
    assert versions == sorted(versions)
    assert versions[-1] == compacted
    for h in seen:  # what it would have sent, against what it sent (X-Context-Tokens)
        tokens, history = int(h["x-compaction-shadow-tokens"]), int(h["x-context-tokens"])
        if h["x-compaction-shadow-status"] == "passthrough":
            assert (tokens, int(h["x-compaction-shadow-saved"])) == (history, 0)
        else:
            assert tokens < history
    last = seen[-1]
    assert int(last["x-context-tokens"]) > 4096 > int(last["x-compaction-shadow-tokens"])
    # The request lines say the same, line for line.
    assert [line["compaction"] for line in lines] == ["shadow"] * TURNS
    assert [line["shadow_status"] for line in lines] == shadow
    saved = [int(h["x-compaction-shadow-saved"]) for h in seen]
    assert [line["shadow_saved"] for line in lines] == saved
    assert [line["ledger_net"] for line in lines] == [0] * TURNS  # nothing was saved
    # The series: requests by what they would have been, and the tokens.
    for status in ("passthrough", "snapshot", "compacted", "trimmed", "failed"):
        want = shadow.count(status)
        assert metric(url, "compaction_proxy_shadow_requests", status=status) == want
    would = sum(int(h["x-compaction-shadow-tokens"]) for h in seen)
    assert metric(url, "compaction_proxy_shadow_tokens", kind="would_send") == would
    history = sum(int(h["x-context-tokens"]) for h in seen)
    assert metric(url, "compaction_proxy_shadow_tokens", kind="history") == history
    summarizer = metric(url, "compaction_proxy_shadow_tokens", kind="summarizer_input")
    summarizer += metric(url, "compaction_proxy_shadow_tokens", kind="summarizer_output")
    assert history - would - summarizer == sum(saved) > 0
    assert metric(url, "compaction_proxy_compactions") == 0  # none made for real
    # No live snapshot; the shadow one says where it would have cut, with no summary.
    session = httpx.get(
        f"{url}/sessions/shadowed", headers={"Authorization": f"Bearer {chat.key}"}
    ).json()
    assert session["version"] == 0
    assert session["summary"] is None
    assert session["shadow"]["version"] == compacted
    assert session["shadow"]["summary"] is None
    assert session["shadow"]["covered_messages"] > 1


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_shadow_summaries_are_kept_apart_and_never_applied(
    store: str, sim_reset: str, start_proxy: Callable[..., str], request: pytest.FixtureRequest
) -> None:
    settings = small_window_settings(sim_reset, mode="shadow", shadow_summarize=True)
    redis_url = request.getfixturevalue("redis_server").url if store == "redis" else None
    if redis_url is not None:
        settings = settings.model_copy(update={"store": StoreSettings(url=redis_url)})
    url = start_proxy(settings)
    chat, sent = recording_chat(url, "summarized", {}, SIM_WINDOW)
    seen = _converse(chat)
    _assert_forwarded_as_sent(sim_reset, sent)
    shadow = [h["x-compaction-shadow-status"] for h in seen]
    assert shadow.count("compacted") >= 3
    assert "failed" not in shadow
    calls = upstream_requests(sim_reset)
    summaries = [c for c in calls if c["headers"].get("x-compaction-purpose") == "summarize"]
    assert len(summaries) >= shadow.count("compacted")  # each one asked for, at its cost
    auth = {"Authorization": f"Bearer {chat.key}"}
    session = httpx.get(f"{url}/sessions/summarized", headers=auth).json()
    assert session["version"] == 0
    assert session["summary"] is None
    kept = session["shadow"]["summary"]
    assert isinstance(kept, str)
    assert len(kept) > 100
    assert session["shadow"]["version"] == shadow.count("compacted")
    # Never applied: no request the proxy sent for the client carries it.
    forwarded = [c["body"] for c in calls if c not in summaries]
    assert not any(kept[:80] in str(body) for body in forwarded)
    # The summarizer's usage is paid for real: the ledger counts it.
    ledger = session["ledger"]
    assert ledger["summarizer_input"] == sum(c["usage"]["prompt_tokens"] for c in summaries)
    if redis_url is not None:  # filed apart: cp:shadow-snap:..., no live snapshot key
        raw = redis.Redis.from_url(redis_url)
        assert raw.keys("cp:snap:*") == []
        assert len(raw.keys("cp:shadow-snap:*")) == 1
        raw.close()
    # Forgetting the session forgets its shadow snapshots too.
    assert httpx.delete(f"{url}/sessions/summarized", headers=auth).status_code == 200
    assert httpx.get(f"{url}/sessions/summarized", headers=auth).status_code == 404
