"""Shadow mode's setting and how it relates to ``compaction.enabled``, in-process
(the conversation end to end: tests/e2e/test_shadow_e2e.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from proxy.compaction.shadow import ShadowStore
from proxy.core.session import session_from_header, tenant_from_headers
from tests.support.fakes import (
    FakeClock,
    FakeUpstream,
    conversation,
    error_reply,
    fake_settings,
    make_services,
)
from tests.test_chat_pipeline import KEY, header, send_chat

LONG = conversation(16)  # past the 4k window's trigger: the proxy would compact it


@pytest.mark.parametrize(
    ("compaction", "mode"),
    [
        ({}, "on"),
        ({"enabled": False}, "off"),
        ({"mode": "off"}, "off"),
        ({"mode": "shadow"}, "shadow"),
        ({"enabled": False, "mode": "off"}, "off"),
    ],
)
def test_mode_defaults_from_enabled(compaction: dict[str, Any], mode: str) -> None:
    assert fake_settings(**compaction).compaction.effective_mode == mode


@pytest.mark.parametrize("mode", ["on", "shadow"])
def test_enabled_false_contradicts_a_mode_that_compacts(mode: str) -> None:
    with pytest.raises(ValidationError, match="contradicts"):
        fake_settings(enabled=False, mode=mode)


async def test_mode_off_sends_a_long_history_as_it_came() -> None:
    upstream = FakeUpstream()
    services = make_services(fake_settings(mode="off"), upstream, FakeClock())
    response = await send_chat(services, LONG)
    assert header(response, "x-compaction-status") == "passthrough"
    assert [c.messages for c in upstream.chat_calls] == [LONG]
    assert upstream.summary_calls == []


@pytest.mark.parametrize("mode", ["on", "shadow"])
async def test_shadow_plans_into_its_own_snapshot_and_sends_the_history(mode: str) -> None:
    """In shadow (the mode, or X-Compaction: shadow), the plan's snapshot is a shadow
    one: no live snapshot, no summary asked for, the history sent as it came."""
    upstream = FakeUpstream()
    services = make_services(fake_settings(mode=mode), upstream, FakeClock())
    headers = {"x-compaction": "shadow", "x-session-id": "s"} if mode == "on" else {}
    response = await send_chat(services, LONG, headers or {"x-session-id": "s"})
    assert header(response, "x-compaction-status") == "shadow"
    assert header(response, "x-compaction-shadow-status") == "compacted"
    assert int(header(response, "x-compaction-shadow-tokens")) < int(
        header(response, "x-context-tokens")
    )
    assert [c.messages for c in upstream.chat_calls] == [LONG]
    assert upstream.summary_calls == []
    key = session_from_header(tenant_from_headers({"authorization": f"Bearer {KEY}"}), "s")
    assert await services.store.load(key) is None
    shadow = await ShadowStore(services.store).load(key)
    assert shadow is not None
    assert (shadow.version, shadow.summary) == (1, "")


async def test_force_in_shadow_is_rate_limited_as_a_live_one() -> None:
    """``X-Compaction: force`` plans a shadow compaction below the trigger, at most once
    per ``force_interval_s`` per session: summary work a client can buy stays bounded."""
    upstream = FakeUpstream()
    services = make_services(fake_settings(mode="shadow"), upstream, FakeClock())
    short = conversation(8)
    headers = {"x-compaction": "force", "x-session-id": "forced"}
    statuses = []
    for history in (short, [*short, {"role": "assistant", "content": "ok"}]):
        response = await send_chat(services, history, headers)
        statuses.append(header(response, "x-compaction-shadow-status"))
    assert statuses == ["compacted", "snapshot"]
    plain = await send_chat(services, short, {"x-session-id": "unforced"})
    assert header(plain, "x-compaction-shadow-status") == "passthrough"


async def test_a_failed_shadow_summary_saves_nothing_and_says_failed() -> None:
    upstream = FakeUpstream()
    settings = fake_settings(mode="shadow", shadow_summarize=True, summary_backoff_s=0)
    services = make_services(settings, upstream, FakeClock())
    upstream.script(summaries=[error_reply(500, "summarizer down")] * 8)
    response = await send_chat(services, LONG, {"x-session-id": "down"})
    assert header(response, "x-compaction-shadow-status") == "failed"
    assert header(response, "x-compaction-shadow-version") == "0"
    assert upstream.summary_calls  # asked for, and failed
    assert [c.messages for c in upstream.chat_calls] == [LONG]  # the request went all the same
    key = session_from_header(tenant_from_headers({"authorization": f"Bearer {KEY}"}), "down")
    assert await ShadowStore(services.store).load(key) is None
    # The summarizer back: the next turn's shadow summary is kept, and never live.
    upstream.summaries.clear()
    response = await send_chat(services, LONG, {"x-session-id": "down"})
    assert header(response, "x-compaction-shadow-status") == "compacted"
    shadow = await ShadowStore(services.store).load(key)
    assert shadow is not None
    assert shadow.summary
    assert await services.store.load(key) is None
