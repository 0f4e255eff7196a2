"""The provider's usage.prompt_tokens corrects our estimates (issue 3); so do the
windows learned from overflow errors (``windows.py``), whose local caches are checked here.
An undercounted model kept inside its window over HTTP: tests/e2e/test_calibrate_e2e.py.
"""

from __future__ import annotations

import pytest

from proxy.observe.metrics import Metrics
from proxy.store.memory import MemoryStore
from proxy.upstream.calibrate import Calibration, find_input_tokens, find_prompt_tokens
from proxy.upstream.windows import LearnedWindows, WindowPolicy, window_key


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        (b'{"usage": {"prompt_tokens": 1234, "completion_tokens": 5}}', 1234),
        (b'data: {"choices":[],"usage":{"prompt_tokens" : 77}}\n\n', 77),
        (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', None),
        (b'{"usage": {"completion_tokens": 5}}', None),
    ],
)
def test_prompt_tokens_are_found_in_bodies_and_chunks(chunk: bytes, expected: int | None) -> None:
    assert find_prompt_tokens(chunk) == expected


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        (b'{"usage": {"input_tokens": 1234, "output_tokens": 5}}', 1234),
        (b'data: {"type":"response.completed","response":{"usage":{"input_tokens" : 77}}}', 77),
        (b'{"usage": {"prompt_tokens": 5}}', None),
    ],
)
def test_responses_input_tokens_are_found(chunk: bytes, expected: int | None) -> None:
    assert find_input_tokens(chunk) == expected


def test_factor_tracks_undercounting_and_ignores_overcounting() -> None:
    cal = Calibration()
    assert cal.factor("t", "m") == 1.0
    for _ in range(30):
        cal.observe("t", "m", ours=1000, theirs=1300)
    assert cal.factor("t", "m") == pytest.approx(1.3, rel=0.01)
    for _ in range(30):
        cal.observe("t", "other", ours=1000, theirs=800)
    assert cal.factor("t", "other") == 1.0  # over-counting only compacts early: left alone
    cal.observe("t", "tiny", ours=10, theirs=40)  # too small to mean anything
    assert cal.factor("t", "tiny") == 1.0


def test_ratios_are_bounded_and_forget_the_least_recently_used_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import proxy.upstream.calibrate

    monkeypatch.setattr(proxy.upstream.calibrate, "_KEYS_LIMIT", 2)  # clients choose model names
    cal = Calibration()
    cal.observe("t", "kept", ours=1000, theirs=1500)
    cal.observe("t", "invented-1", ours=1000, theirs=1500)
    assert cal.factor("t", "kept") == 1.5  # a read counts as use
    cal.observe("t", "invented-2", ours=1000, theirs=1500)
    assert cal.factor("t", "kept") == 1.5
    assert cal.factor("t", "invented-1") == 1.0  # forgotten: back to no correction


def test_an_update_counts_as_use_and_a_miss_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.upstream.calibrate

    monkeypatch.setattr(proxy.upstream.calibrate, "_KEYS_LIMIT", 2)
    cal = Calibration()
    cal.observe("t", "a", ours=1000, theirs=1500)
    cal.observe("t", "b", ours=1000, theirs=1500)
    for name in ("x", "y", "z"):  # misses: nothing stored, nothing forgotten
        assert cal.factor("t", name) == 1.0
    cal.observe("t", "a", ours=1000, theirs=1500)  # learned again: "b" is the oldest now
    cal.observe("t", "c", ours=1000, theirs=1500)
    assert (cal.factor("t", "a"), cal.factor("t", "b"), cal.factor("t", "c")) == (1.5, 1.0, 1.5)


class _Reference:
    """Calibration as it was, on cachetools' LRUCache: the order it forgets in."""

    def __init__(self, limit: int) -> None:
        from cachetools import LRUCache

        self.ratio: LRUCache[tuple[str, str], float] = LRUCache(limit)

    def observe(self, tenant: str, model: str, ours: int, theirs: int) -> None:
        ratio = min(max(theirs / ours, 0.5), 2.0)
        old = self.ratio.get((tenant, model))
        self.ratio[tenant, model] = ratio if old is None else old + 0.2 * (ratio - old)

    def factor(self, tenant: str, model: str) -> float:
        return max(self.ratio.get((tenant, model), 1.0), 1.0)


def test_ratios_are_kept_and_forgotten_as_by_an_lru_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import proxy.upstream.calibrate

    monkeypatch.setattr(proxy.upstream.calibrate, "_KEYS_LIMIT", 4)
    rng = random.Random(27)
    cal, reference = Calibration(), _Reference(4)
    for _ in range(3000):
        key = (rng.choice("tu"), rng.choice("abcd"))
        if rng.random() < 0.5:
            theirs = rng.randrange(800, 2500)
            cal.observe(*key, ours=1000, theirs=theirs)
            reference.observe(*key, ours=1000, theirs=theirs)
        else:
            assert cal.factor(*key) == reference.factor(*key)
    assert cal._ratio == dict(reference.ratio)  # the same ratios kept at the end


def test_each_tenant_keeps_its_own_calibration() -> None:
    """What a request contains is its caller's choice: one caller's skewed counts
    (files the upstream counts far higher) must not shrink anyone else's window."""
    cal = Calibration()
    for _ in range(30):
        cal.observe("attacker", "m", ours=1000, theirs=2000)
    assert cal.factor("attacker", "m") == pytest.approx(2.0, rel=0.01)
    assert cal.factor("victim", "m") == 1.0


# --- learned windows: what each replica keeps locally ------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__(ttl_s=3600)
        self.window_loads = 0

    async def load_window(self, key: str) -> int | None:
        self.window_loads += 1
        return await super().load_window(key)


def learned_windows(store: CountingStore, clock: FakeClock) -> LearnedWindows:
    policy = WindowPolicy("up", 3600, quorum=2, interval_s=0)
    return LearnedWindows(store, policy, Metrics.create(), clock=clock)


async def test_a_window_read_is_kept_five_seconds_then_read_again() -> None:
    store, clock = CountingStore(), FakeClock()
    windows = learned_windows(store, clock)
    assert await windows.get("m") is None
    await store.save_window(window_key("up", "m"), 4096, 60)  # another replica learns one
    clock.now += 4.9
    assert await windows.get("m") is None, "served from the local copy"
    assert store.window_loads == 1
    clock.now += 0.2
    assert await windows.get("m") == 4096
    assert store.window_loads == 2


async def test_a_window_this_replica_learns_is_in_force_at_once() -> None:
    store, clock = CountingStore(), FakeClock()
    windows = learned_windows(store, clock)
    assert await windows.get("m", "aa") is None
    await windows.learn("m", 2048, "aa", configured=8192, stated=None)
    loads = store.window_loads
    assert await windows.get("m", "aa") == 2048
    assert store.window_loads == loads, "the local copy was updated, not dropped"


async def test_reports_older_than_an_hour_do_not_count_towards_a_quorum() -> None:
    store, clock = CountingStore(), FakeClock()
    windows = learned_windows(store, clock)
    await windows.learn("m", 4096, "aa", configured=8192, stated=4096)
    clock.now += 3601
    await windows.learn("m", 4096, "bb", configured=8192, stated=4096)
    assert await windows.get("m") is None, "aa's report had expired: no quorum"
    clock.now += 3599
    await windows.learn("m", 4096, "cc", configured=8192, stated=4096)
    assert await windows.get("m") == 4096, "bb and cc agree within the hour"
