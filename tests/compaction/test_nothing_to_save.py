"""A plan with nothing to save (issue 24 item 3), in-process: steps 3-8 of the pipeline
with the fake upstream and clock. Counted and backed off, never written; the back-off
holds a threshold summary while the view fits, and ends with the next compaction."""

from __future__ import annotations

import pytest

from proxy.core.outcome import Outcome
from proxy.core.session import session_from_header
from proxy.pipeline import compacted_view
from proxy.services import Services
from proxy.types import ChatMessage
from tests.support.fakes import (
    FILLER,
    TENANT,
    FakeClock,
    FakeUpstream,
    fake_settings,
    make_services,
    metric,
    summary_reply,
    turn_of,
)

# A pinned system prompt of ~3,000 tokens in the 4k window (trigger 3,276 with the 256
# reserved): a few short turns pass the trigger, and nothing before them is worth a
# summary of up to 460 tokens.
INSTRUCTIONS = FILLER * 30


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def services(upstream: FakeUpstream, clock: FakeClock) -> Services:
    return make_services(fake_settings(precompact_ratio=None), upstream, clock)


def history(short: int, long: int = 0) -> list[ChatMessage]:
    """The pinned prompt, ``short`` short pairs then ``long`` pairs of ~100 tokens, a question."""
    messages: list[ChatMessage] = [{"role": "system", "content": INSTRUCTIONS}]
    for t in range(short):
        messages.append({"role": "user", "content": f"Short {t}: ok?"})
        messages.append({"role": "assistant", "content": f"Ok {t}."})
    for t in range(long):
        messages.append({"role": "user", "content": f"Long {t}: {FILLER}"})
        messages.append({"role": "assistant", "content": f"Noted {t}. {FILLER}"})
    messages.append({"role": "user", "content": "And now?"})
    return messages


async def view(services: Services, messages: list[ChatMessage]) -> Outcome:
    outcome, _ = await compacted_view(services, await turn_of(services, messages, "s1"))
    return outcome


async def test_nothing_to_save_is_counted_backed_off_and_never_written(
    services: Services, upstream: FakeUpstream, clock: FakeClock
) -> None:
    key = session_from_header(TENANT, "s1")
    for short in (3, 4, 5):
        outcome = await view(services, history(short))
        assert outcome.tokens + 256 > int(4096 * 0.8), "past the trigger"
        assert (outcome.status, outcome.version, outcome.messages) == ("passthrough", 0, None)
    assert await services.store.load(key) is None, "no snapshot written"
    assert upstream.summary_calls == []
    nothing = metric(
        services.metrics, "compactions", trigger="threshold", outcome="nothing_to_save"
    )
    assert nothing == 3
    assert metric(services.metrics, "compactions", trigger="threshold", outcome="compacted") == 0

    # Grown past what a summary costs, still within the window: the back-off holds it.
    grown = history(5, long=3)
    held = await view(services, grown)
    assert held.tokens + 256 <= 4096
    assert (held.status, held.version, held.degraded) == ("passthrough", 0, None)
    assert upstream.summary_calls == []
    assert metric(services.metrics, "compactions", trigger="threshold", outcome="backoff") == 1

    # Once the back-off has run out, the summary it held is asked for, and saved.
    clock.advance(31)
    upstream.script(summaries=[summary_reply()])
    done = await view(services, grown)
    assert (done.status, done.version) == ("compacted", 1)
    assert len(upstream.summary_calls) == 1
    assert not services.compactor.idle.active(key), "a compaction ends the back-off"
