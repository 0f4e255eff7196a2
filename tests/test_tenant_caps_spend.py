"""What a tenant's caps count (compaction/caps.py) wherever a summary is asked for: a
background run's, after its request's line was written, and shadow mode's
(``shadow_summarize``, compaction/shadow.py)."""

from __future__ import annotations

import pytest

from proxy.config import Settings
from proxy.core.session import tenant_from_headers
from proxy.observe.record import Record, recording
from tests.support.fakes import FakeClock, FakeUpstream, conversation, fake_settings, make_services
from tests.test_chat_pipeline import KEY, header, send_chat
from tests.test_tenant_policy import _capped


async def test_a_background_summary_after_the_request_ended_counts_its_tokens() -> None:
    _, _, caps, turn = await _capped({"summarizer_tokens_per_day": 500})
    record = Record("r", 0.0, tenant=turn.tenant)
    record.finished = True  # a background run: the request's line was written already

    async def fold() -> str:
        record.summary_used("m", (400, 100, False))  # what summarize.py records
        return "summary"

    with recording(record):
        assert await caps.admit(turn) is None
        assert await caps.spending(turn, fold()) == "summary"
        assert await caps.admit(turn) == "summarizer_tokens_per_day"
    assert record.summarized == (0, 0, False)  # its line was written: the ledger's late


@pytest.mark.parametrize(
    ("cap", "reason"),
    [
        ({"summaries_per_hour": 1}, "summaries_per_hour"),
        ({"summarizer_tokens_per_day": 1}, "summarizer_tokens_per_day"),
    ],
)
async def test_shadow_summaries_are_admitted_and_spent(cap: dict[str, int], reason: str) -> None:
    """The first shadow summary goes ahead (and spends); over the cap the next session's
    is not asked for: the shadow view as it is, counted in ``tenant_capped_total``."""
    s = fake_settings(mode="shadow", shadow_summarize=True, summary_backoff_s=0)
    tenant = tenant_from_headers({"authorization": f"Bearer {KEY}"})
    s = Settings(**{**s.model_dump(), "tenants": [{"id": tenant, **cap}]})
    upstream = FakeUpstream()
    services = make_services(s, upstream, FakeClock())
    long = conversation(16)
    first = await send_chat(services, long, {"x-session-id": "one"})
    assert header(first, "x-compaction-shadow-status") == "compacted"
    calls = len(upstream.summary_calls)
    assert calls
    second = await send_chat(services, long, {"x-session-id": "two"})
    assert header(second, "x-compaction-shadow-status") == "passthrough"
    assert len(upstream.summary_calls) == calls  # none asked for over the cap
    assert services.metrics.tenants.capped.labels(reason=reason)._value.get() == 1
    assert [c.messages for c in upstream.chat_calls] == [long, long]  # forwarded as sent
