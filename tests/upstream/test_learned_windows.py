"""Who may shrink a model's window, and how fast: ``proxy.upstream.windows.LearnedWindows`` on a
fake clock, over the in-process store (the store keeps the shared lowering's marker,
so the interval runs on the store's clock as it would on Redis's)."""

from __future__ import annotations

import pytest

from proxy.core.models import ResolvedModel
from proxy.observe.metrics import Metrics
from proxy.store.memory import MemoryStore
from proxy.upstream.windows import (
    LOWERED_MARKER,
    MIN_WINDOW,
    LearnedWindows,
    WindowPolicy,
    parse_window_key,
    window_key,
)
from tests.support.fakes import FakeClock

CONFIGURED = 8192
INTERVAL = 600.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def windows(clock: FakeClock) -> LearnedWindows:
    store = MemoryStore(ttl_s=3600, clock=clock)
    policy = WindowPolicy("up", ttl_s=86400, quorum=2, interval_s=INTERVAL)
    return LearnedWindows(store, policy, Metrics.create(), clock=clock)


async def report(windows: LearnedWindows, tenant: str, limit: int) -> int:
    """``tenant``'s request was refused by an upstream that stated ``limit``."""
    return await windows.learn("m", limit, tenant, configured=CONFIGURED, stated=limit)


async def test_one_tenants_report_shrinks_only_its_own_window(windows: LearnedWindows) -> None:
    assert await report(windows, "aa", 4096) == 4096
    assert await windows.get("m", "aa") == 4096
    assert await windows.get("m", "bb") is None
    assert await windows.get("m") is None
    for _ in range(5):  # however often it says so
        await report(windows, "aa", 4096)
    assert await windows.get("m") is None


async def test_a_quorum_lowers_the_shared_window_to_what_they_all_agree_on(
    windows: LearnedWindows,
) -> None:
    await report(windows, "aa", 5000)
    await report(windows, "bb", 6000)
    assert await windows.get("m") == 6000, "the largest report: every reporter fits in it"
    assert await windows.get("m", "cc") == 6000, "a tenant that never reported gets it too"
    assert await windows.get("m", "aa") == 5000, "a tenant's own smaller window stays"


async def test_a_shared_window_drops_by_at_most_half_per_lowering(
    windows: LearnedWindows,
) -> None:
    await report(windows, "aa", 1000)
    await report(windows, "bb", 1000)
    assert await windows.get("m") == CONFIGURED // 2


async def test_the_next_lowering_waits_out_the_interval(
    windows: LearnedWindows, clock: FakeClock
) -> None:
    await report(windows, "aa", 6000)
    await report(windows, "bb", 6000)
    await report(windows, "aa", 5000)
    await report(windows, "bb", 5000)
    assert await windows.get("m") == 6000, "lowered a moment ago: not again yet"
    clock.advance(INTERVAL + 1)
    await report(windows, "cc", 5000)
    assert await windows.get("m") == 5000


async def test_a_larger_report_never_widens_a_learned_window(windows: LearnedWindows) -> None:
    await report(windows, "aa", 4096)
    assert await report(windows, "aa", 6000) == 4096
    await report(windows, "bb", 7000)
    await report(windows, "cc", 7000)
    await report(windows, "dd", 6500)
    assert await windows.get("m", "aa") == 4096


async def test_nothing_is_learned_below_the_minimum(windows: LearnedWindows) -> None:
    assert await windows.learn("m", 10, "aa", configured=CONFIGURED, stated=None) == MIN_WINDOW


async def test_a_request_plans_against_the_smaller_of_configured_and_learned(
    windows: LearnedWindows,
) -> None:
    model = ResolvedModel("m", CONFIGURED, 256, "cl100k_base", "m")
    assert await windows.apply(model, "aa") is model
    await report(windows, "aa", 4096)
    assert (await windows.apply(model, "aa")).context_window == 4096
    assert await windows.apply(model, "bb") is model
    small = ResolvedModel("m", 2048, 256, "cl100k_base", "m")
    assert await windows.apply(small, "aa") is small


# Issue 20, item 6: keys are unambiguous, so no model name spells another key.


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("up", "vm|anonymous", None), ("up", "vm", "anonymous")),
        (("up|vm", "anonymous", None), ("up", "vm", "anonymous")),
        (("up", "vm|!lowered", None), ("up", "vm", None)),
        (("u", "p:vm", None), ("u:p", "vm", None)),
        (("up", "2:vm", None), ("up", "", "vm")),
    ],
)
def test_distinct_parts_never_share_a_key(
    one: tuple[str, str, str | None], other: tuple[str, str, str | None]
) -> None:
    assert window_key(*one) != window_key(*other)
    assert parse_window_key(window_key(*one)) == one
    assert parse_window_key(window_key(*other)) == other


def test_markers_and_old_keys_are_not_window_keys() -> None:
    shared = window_key("up", "vm")
    assert parse_window_key(f"{shared}{LOWERED_MARKER}") is None
    assert parse_window_key("up|vm|anonymous") is None
    assert parse_window_key("w2|5:up") is None


async def test_a_model_named_like_a_tenant_key_lowers_no_tenants_window(
    windows: LearnedWindows,
) -> None:
    """Before: the shared window of ``m|anonymous`` was keyless callers' own window of
    ``m``, since both keys read ``up|m|anonymous``."""
    for tenant in ("aa", "bb"):
        await windows.learn("m|anonymous", 1000, tenant, configured=CONFIGURED, stated=1000)
    assert await windows.get("m|anonymous") == CONFIGURED // 2
    assert await windows.get("m", "anonymous") is None
    assert await windows.get("m") is None
