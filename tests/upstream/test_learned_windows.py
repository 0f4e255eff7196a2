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


async def test_windows_are_read_from_the_store_once_per_local_period(clock: FakeClock) -> None:
    """A replica keeps what the store said (a window, or nothing learned) for a few
    seconds: a request then applies it without asking the store; later it asks again,
    and so sees what another replica learned meanwhile."""
    from proxy.upstream.windows import _LOCAL_S

    store = MemoryStore(ttl_s=3600, clock=clock)
    reads: list[str] = []
    load_window = store.load_window

    async def counted(key: str) -> int | None:
        reads.append(key)
        return await load_window(key)

    store.load_window = counted  # type: ignore[method-assign]
    policy = WindowPolicy("up", ttl_s=86400, quorum=2, interval_s=INTERVAL)
    windows = LearnedWindows(store, policy, Metrics.create(), clock=clock)
    model = ResolvedModel("m", CONFIGURED, 1024, "cl100k_base", "default")
    for _ in range(3):
        assert (await windows.apply(model, "t1")).context_window == CONFIGURED
    assert len(reads) == 2  # the shared key and the tenant's, once
    await store.save_window(window_key("up", "m", "t1"), 4096, 3600)  # another replica
    assert (await windows.apply(model, "t1")).context_window == CONFIGURED  # not yet seen
    clock.advance(_LOCAL_S)
    assert (await windows.apply(model, "t1")).context_window == 4096
    assert len(reads) == 4


def test_the_local_copy_stays_bounded() -> None:
    from proxy.upstream.windows import _LOCAL_LIMIT, _MISSING, _Recent

    clock = FakeClock()
    recent = _Recent(clock)
    for i in range(_LOCAL_LIMIT + 5):
        recent.put(f"k{i}", i)
    assert len(recent._entries) == _LOCAL_LIMIT
    assert recent.get("k0") is _MISSING  # the oldest went
    assert recent.get(f"k{_LOCAL_LIMIT + 4}") == _LOCAL_LIMIT + 4
    clock.advance(60)
    assert recent.get(f"k{_LOCAL_LIMIT + 4}") is _MISSING
