"""Output ceilings (``proxy.upstream.ceilings.LearnedCeilings``) are learned as windows are
(the same quorum and expiry), under keys of their own, from a stated output limit only."""

from __future__ import annotations

import orjson
import pytest

from proxy.config import Settings
from proxy.core.models import ModelTable
from proxy.core.outcome import Outcome, Turn
from proxy.observe.metrics import Metrics
from proxy.routes.chat import CHAT
from proxy.routes.messages import MESSAGES
from proxy.store.memory import MemoryStore
from proxy.upstream.api import Attempt
from proxy.upstream.ceilings import LearnedCeilings
from proxy.upstream.overflow import Overflow
from proxy.upstream.windows import LearnedWindows, WindowPolicy, parse_window_key
from tests.support.fakes import FakeClock

WINDOW = 128_000


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(ttl_s=3600, clock=clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _learned(store: MemoryStore, clock: FakeClock, cls: type[LearnedWindows]) -> LearnedWindows:
    policy = WindowPolicy("up", ttl_s=86400, quorum=2, interval_s=600.0)
    return cls(store, policy, Metrics.create(), clock=clock)


def _turn(tenant: str, asked: int | None) -> Turn:
    model = ModelTable(Settings(upstream={"base_url": "http://127.0.0.1:1/v1"})).resolve("m")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if asked is not None:
        chat["max_tokens"] = asked
    body = orjson.dumps(chat)
    return Turn(chat, body, model, tenant, None, [])


def _attempt(turn: Turn) -> Attempt:
    return Attempt(turn.body, Outcome.passthrough(turn.body, WINDOW))


async def test_a_stated_output_limit_clamps_the_tenants_next_request_at_once(
    store: MemoryStore, clock: FakeClock
) -> None:
    ceilings = _learned(store, clock, LearnedCeilings)
    assert isinstance(ceilings, LearnedCeilings)
    turn = _turn("aa", 32_000)
    refusal = Overflow("output_budget", limit=4096, requested=32_000)
    verdict, retry = await ceilings.budget_retry(CHAT, turn, _attempt(turn), refusal)
    assert verdict.kind == "output_budget"
    assert retry is not None
    assert orjson.loads(retry.body)["max_tokens"] == 4096
    clamped = await ceilings.clamp(CHAT, turn, _attempt(turn))
    assert orjson.loads(clamped.body)["max_tokens"] == 4096
    assert clamped.outcome.clamped == 4096
    other = _turn("bb", 32_000)  # another tenant: one report is no quorum
    assert await ceilings.clamp(CHAT, other, _attempt(other)) == _attempt(other)
    within = _turn("aa", 1000)  # asks for less than the limit: as it came
    assert await ceilings.clamp(CHAT, within, _attempt(within)) == _attempt(within)


async def test_a_quorum_of_tenants_clamps_everyones_requests(
    store: MemoryStore, clock: FakeClock
) -> None:
    ceilings = _learned(store, clock, LearnedCeilings)
    assert isinstance(ceilings, LearnedCeilings)
    for tenant in ("aa", "bb"):
        await ceilings.learn("m", 4096, tenant, configured=8192, stated=4096)
    assert await ceilings.ceiling("m", "cc") == 4096


async def test_a_budget_worked_out_from_the_window_is_not_learned(
    store: MemoryStore, clock: FakeClock
) -> None:
    """Anthropic's "input length and `max_tokens` exceed context limit" depends on the
    prompt: recovery lowers the budget, but it is no limit of the model's."""
    ceilings = _learned(store, clock, LearnedCeilings)
    assert isinstance(ceilings, LearnedCeilings)
    turn = _turn("aa", 32_000)
    overflow = Overflow("overflow", limit=200_000, prompt_tokens=180_000, completion_tokens=32_000)
    verdict, retry = await ceilings.budget_retry(MESSAGES, turn, _attempt(turn), overflow)
    assert verdict.kind == "output_budget"
    assert retry is not None
    assert await ceilings.ceiling("m", "aa") is None


async def test_ceilings_and_windows_never_share_a_key(store: MemoryStore, clock: FakeClock) -> None:
    windows = _learned(store, clock, LearnedWindows)
    ceilings = _learned(store, clock, LearnedCeilings)
    await ceilings.learn("m", 4096, "aa", configured=WINDOW, stated=4096)
    assert await windows.get("m", "aa") is None
    assert await ceilings.get("m", "aa") == 4096
    keys = list(store._windows)
    assert keys
    assert all(parse_window_key(k) is None for k in keys)
