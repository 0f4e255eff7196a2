"""core/cache_cuts.py: when a view served before is held, what a cache-aware turn plans
for a newer snapshot, and where a held session's background compaction folds in to.
Figures worked out by hand."""

from __future__ import annotations

import pytest

from proxy.core.budget import Budget
from proxy.core.cache_cuts import cache_plan, holds, landing_ratio

BUDGET = Budget(
    window=10_000, reserve=256, fixed=0, trigger=8000, target=5000, summary_allowance=460
)


@pytest.mark.parametrize(
    ("tokens", "held"),
    [
        (None, False),  # nothing served before, or it no longer applies to the history
        (5000, True),
        (7999, True),
        (8000, True),  # at the trigger still fits: the trigger compacts only past it
        (8001, False),  # past the trigger: the cut must move
    ],
)
def test_a_view_served_before_is_held_while_it_fits_under_the_trigger(
    tokens: int | None, held: bool
) -> None:
    assert holds(tokens, BUDGET) is held


@pytest.mark.parametrize(
    ("tokens", "caches", "warm", "plan"),
    [
        (7000, True, True, "held"),  # under the trigger, cached and warm: it waits
        (8000, True, True, "held"),
        (7000, True, False, "expired"),  # idle past the TTL: the prefix is paid anyway
        (8001, True, True, "trigger"),  # past the trigger: applied, warm or not
        (8001, True, False, "trigger"),
        (7000, False, True, "uncached"),  # no cached tokens reported: nothing to keep
        (7000, False, False, "uncached"),
        (None, True, True, "changed"),  # the history no longer starts with the held view
    ],
)
def test_a_newer_snapshot_waits_only_while_the_held_view_is_cached_and_under_the_trigger(
    tokens: int | None, caches: bool, warm: bool, plan: str
) -> None:
    assert cache_plan(tokens, BUDGET, caches=caches, warm=warm) == plan


@pytest.mark.parametrize(
    ("trigger", "target", "precompact", "landing"),
    [
        (0.8, 0.5, 0.6, 0.3),  # the defaults: 0.3 + the 0.2 grown by the trigger = 0.5
        (0.8, 0.5, 0.7, 0.4),  # a later start leaves less to fold in
        (0.9, 0.6, 0.75, 0.45),
        (0.8, 0.5, 0.4, 0.125),  # 0.5 - 0.4 = 0.1 is under half the scaled target (0.25 / 2)
        (0.8, 0.5, 0.2, 0.0625),  # nothing to land at: half the scaled target (0.125 / 2)
    ],
)
def test_a_held_background_compaction_lands_at_the_target_when_applied_at_the_trigger(
    trigger: float, target: float, precompact: float, landing: float
) -> None:
    assert landing_ratio(trigger, target, precompact) == pytest.approx(landing)
