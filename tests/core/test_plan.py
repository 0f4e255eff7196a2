"""plan.py: pinning, legal cuts, token arithmetic and the compaction decision.

Expected figures are worked out by hand in the tables; the property tests
check the rules against a small independent oracle, never against the
implementation's own helpers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TypeVar, overload

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.budget import Budget
from proxy.core.history import History, count_pinned, result_flags
from proxy.core.plan import plan_compaction
from proxy.core.trim import trim_plan
from proxy.core.view import ELIDED_TOKENS, Totals, View, view_tokens
from proxy.types import ChatMessage
from tests.support.conversations import convo, group_starts, measured
from tests.support.examples import examples

T = TypeVar("T")
PROPERTY = settings(
    max_examples=examples(250),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def budget(**kw: int) -> Budget:
    base = {
        "window": 1000,
        "reserve": 100,
        "fixed": 0,
        "trigger": 899,
        "target": 500,
        "summary_allowance": 50,
        "min_tail_messages": 4,
        "elide_min_tokens": 400,
    }
    base.update(kw)
    return Budget(**base)


# --- count_pinned -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "pin_first_user", "expected"),
    [
        ("", True, 0),
        ("s", True, 0),  # the only message is the newest one
        ("s s", False, 1),
        ("s d s", True, 2),
        ("s u a u", True, 2),
        ("s u a u", False, 1),
        ("d s u", True, 2),  # the first user message is the newest: not pinned
        ("u", True, 0),
        ("u a u", True, 1),
        ("u a u", False, 0),
        ("a u", True, 0),  # first message after the system block is not a user message
        ("s a u", True, 1),
        ("s u s u", True, 2),  # a later system message is not leading
    ],
)
def test_count_pinned(spec: str, pin_first_user: bool, expected: int) -> None:
    assert count_pinned(convo(spec), pin_first_user) == expected


ENV = "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"
AGENTS = "# AGENTS.md instructions for /repo"


def _said(role: str, *texts: str) -> ChatMessage:
    return {"role": role, "content": [{"type": "text", "text": t} for t in texts]}


@pytest.mark.parametrize(
    ("messages", "pin_first_user", "expected"),
    [
        # Codex: one context message of several parts; a part other than the first opens it.
        ([_said("developer", "d"), _said("user", AGENTS, ENV), _said("user", "go")], False, 2),
        # Earlier Codex: one message per part, each pinned while they follow each other.
        ([_said("system", "s"), _said("user", AGENTS), _said("user", ENV), _said("user", "go")],
         False, 3),
        # A string content, leading whitespace aside.
        ([{"role": "user", "content": "\n " + ENV}, _said("user", "go")], False, 1),
        # Only in a row: a context message after a turn is not leading.
        ([_said("user", "go"), _said("assistant", ENV), _said("user", ENV), _said("user", "x")],
         False, 0),
        ([_said("user", "go"), _said("user", ENV), _said("user", "x")], True, 2),
        # Opening with the prefix, not containing it.
        ([_said("user", "see " + ENV), _said("user", "x")], False, 0),
        ([{"role": "user", "content": None}, _said("user", "x")], False, 0),
        ([{"role": "user", "content": [{"type": "image_url"}]}, _said("user", "x")], False, 0),
        # The newest message is never pinned, whatever it opens with.
        ([_said("user", ENV)], False, 0),
    ],
)  # fmt: skip
def test_count_pinned_by_prefix(
    messages: list[ChatMessage], pin_first_user: bool, expected: int
) -> None:
    prefixes = ("<environment_context>", "# AGENTS.md instructions")
    assert count_pinned(messages, pin_first_user, prefixes) == expected


# --- group starts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "start", "expected"),
    [
        ("s u c2 t t a u", 0, [0, 1, 2, 5, 6]),
        ("s u c2 t t a u", 2, [2, 5, 6]),
        ("s u c2 t t a u", 3, [5, 6]),  # never between the calls and their results
        ("s u c1 t c1 t u", 1, [1, 2, 4, 6]),
        ("u t a", 0, [0, 2]),  # an orphan result joins the group before it
        ("t u", 0, [0, 1]),
        ("u a", 5, []),
        ("s u c3 t t t", 0, [0, 1, 2]),
    ],
)
def test_group_starts(spec: str, start: int, expected: list[int]) -> None:
    assert group_starts(result_flags(convo(spec)), start) == expected


# --- view_tokens --------------------------------------------------------------------------

_TOOLS = convo("s u c1 t a u")
_TOOL_COUNTS = [10, 20, 30, 500, 40, 50]


@pytest.mark.parametrize(
    ("view", "elide_min", "expected"),
    [
        (View(1, 0, 1), 400, 10 + 20 + 30 + 500 + 40 + 50 + 10),
        (View(1, 99, 1), 400, 660),  # no summary is sent when nothing is covered
        (View(2, 99, 1), 400, 10 + 99 + 30 + 500 + 40 + 50 + 10),
        (View(2, 99, 4), 400, 10 + 99 + 30 + ELIDED_TOKENS + 40 + 50 + 10),
        (View(2, 99, 3), 400, 739),  # elide_before is exclusive
        (View(1, 0, 6), 400, 10 + 20 + 30 + ELIDED_TOKENS + 40 + 50 + 10),
        (View(1, 0, 6), 500, 10 + 20 + 30 + ELIDED_TOKENS + 40 + 50 + 10),  # exactly elide_min
        (View(1, 0, 6), 501, 660),
        (View(4, 99, 6), 400, 10 + 99 + 40 + 50 + 10),  # summarised, not elided
    ],
)
def test_view_tokens(view: View, elide_min: int, expected: int) -> None:
    b = budget(fixed=7, reserve=3, elide_min_tokens=elide_min)
    assert view_tokens(measured(_TOOLS, _TOOL_COUNTS, 1), view, b) == expected


def test_view_tokens_never_elides_the_newest_message() -> None:
    messages = convo("s u c1 t")
    assert (
        view_tokens(measured(messages, [10, 20, 30, 900], 1), View(1, 0, 4), budget(reserve=0))
        == 960
    )


# --- plan_compaction: plain conversation --------------------------------------------------

# s u a u a u a u, 100 tokens each, reserve 100: 900 in all; a cut at c costs
# 100 (pinned) + 50 (allowance) + 100 * (8 - c) + 100 (reserve).
_CHAT = convo("s u a u a u a u")
_CHAT_COUNTS = [100] * 8
_FRESH = View(1, 0, 1)


@pytest.mark.parametrize(
    ("trigger", "target", "action", "summarize", "tokens"),
    [
        (900, 500, "keep", (1, 1), 900),  # at the trigger: no compaction
        (899, 500, "compact", (1, 6), 450),
        (899, 450, "compact", (1, 6), 450),  # exactly at the target
        (899, 449, "compact", (1, 7), 350),
        (899, 349, "compact", (1, 7), 350),  # unreachable: largest cut, newest kept
        (899, 650, "compact", (1, 4), 650),  # keeps min_tail_messages
        (899, 649, "compact", (1, 5), 550),
    ],
)
def test_plan_boundaries(
    trigger: int, target: int, action: str, summarize: tuple[int, int], tokens: int
) -> None:
    b = budget(trigger=trigger, target=target)
    plan = plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), _FRESH, b)
    assert (plan.action, plan.summarize, plan.tokens) == (action, summarize, tokens)
    assert plan.view.covered == summarize[1]
    assert plan.view.summary_tokens == (50 if action == "compact" else 0)
    assert plan.fits


def test_plan_extends_an_existing_summary_incrementally() -> None:
    current = View(3, 200, 3)  # 100 + 200 + 5 * 100 + 100 = 900
    plan = plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), current, budget())
    assert (plan.action, plan.summarize, plan.tokens) == ("compact", (3, 6), 450)
    assert plan.view == View(6, 50, 4)


@pytest.mark.parametrize(("window", "fits"), [(350, True), (349, False)])
def test_plan_fits_says_whether_the_window_holds_it(window: int, fits: bool) -> None:
    b = budget(window=window, trigger=300, target=200)
    plan = plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), _FRESH, b)
    assert (plan.summarize, plan.tokens, plan.fits) == ((1, 7), 350, fits)


def test_plan_keeps_when_only_the_newest_group_is_left() -> None:
    messages = convo("s u")
    plan = plan_compaction(measured(messages, [100, 5000], 1), View(1, 0, 1), budget(window=4000))
    assert plan.action == "keep"
    assert (plan.tokens, plan.fits) == (5200, False)


def test_a_plan_that_saves_no_tokens_is_nothing_to_save() -> None:
    """Issue 24 item 3: a pinned prefix dominates the window (Codex's instructions in a
    16k window). Nothing is bulky enough to elide, and a summary would cost more than
    the few small turns it replaces: eliding "nothing" moves ``elide_before`` (a view
    that differs) at the same token count, which is no compaction."""
    messages = convo("s u a u a u a u a")
    counts = [12_500] + [80] * 8  # 12,500 + 640 + 500 reserve = 13,640: past 12,800
    b = budget(window=16_000, reserve=500, trigger=12_800, target=8_000, summary_allowance=660)
    current = View(1, 0, 1)
    plan = plan_compaction(measured(messages, counts, 1), current, b)
    assert (plan.action, plan.view, plan.summarize) == ("keep", current, (1, 1))
    assert plan.nothing_to_save
    assert (plan.tokens, plan.fits) == (13_640, True)
    # Under the trigger the same view is simply kept.
    under = plan_compaction(measured(messages, counts, 1), current, replace(b, trigger=14_000))
    assert (under.action, under.nothing_to_save) == ("keep", False)


def test_an_elision_that_saves_tokens_is_still_a_compaction() -> None:
    messages = convo("s u c1 t a u a u a")
    counts = [12_500, 80, 80, 1_000, 80, 80, 80, 80, 80]  # one bulky result to elide
    b = budget(window=16_000, reserve=500, trigger=12_800, target=8_000, summary_allowance=660)
    plan = plan_compaction(measured(messages, counts, 1), View(1, 0, 1), b)
    assert (plan.action, plan.summarize, plan.nothing_to_save) == ("compact", (1, 1), False)
    assert plan.tokens == 12_500 + 7 * 80 + ELIDED_TOKENS + 500


def test_plan_cut_never_splits_a_tool_group() -> None:
    messages = convo("s u c1 t a u a u")
    # A cut at 3 would reach 750 exactly, but separates the call from its result.
    plan = plan_compaction(measured(messages, _CHAT_COUNTS, 1), _FRESH, budget(target=750))
    assert (plan.summarize, plan.tokens) == ((1, 4), 650)


def test_plan_never_summarizes_the_newest_group() -> None:
    messages = convo("s u c2 t t")
    b = budget(window=10_000, summary_allowance=5)
    plan = plan_compaction(measured(messages, [10, 10, 10, 3000, 3000], 1), View(1, 0, 1), b)
    assert plan.summarize == (1, 2)  # the calls and both results stay, none elided
    assert (plan.tokens, plan.fits) == (10 + 5 + 6010 + 100, True)


# --- plan_compaction: elision -------------------------------------------------------------

# s u c1 t a u c1 t a u, results of 1000 tokens, the rest 50, no reserve: 2400.
# Eliding result 3 (result 7 is in the protected tail) saves 960: 1440.
_AGENT = convo("s u c1 t a u c1 t a u")
_AGENT_COUNTS = [50, 50, 50, 1000, 50, 50, 50, 1000, 50, 50]


def agent_budget(**kw: int) -> Budget:
    base = {"window": 5000, "reserve": 0, "trigger": 2000, "summary_allowance": 100}
    base.update(kw)
    return budget(**base)


@pytest.mark.parametrize(
    ("changes", "summarize", "view", "tokens"),
    [
        # Elision alone: no model call (2400 - 1000 + ELIDED_TOKENS).
        ({"target": 1460 + ELIDED_TOKENS}, (1, 1), View(1, 0, 6), 1400 + ELIDED_TOKENS),
        ({"target": 1400 + ELIDED_TOKENS}, (1, 1), View(1, 0, 6), 1400 + ELIDED_TOKENS),
        # 50 + 100 + 1300 + ELIDED_TOKENS at cut 2 and 1250 + ELIDED_TOKENS at cut 3
        # (elision alone's total) miss it.
        ({"target": 1399 + ELIDED_TOKENS}, (1, 4), View(4, 100, 6), 1400),
        ({"target": 1400}, (1, 4), View(4, 100, 6), 1400),
        ({"target": 1399}, (1, 5), View(5, 100, 6), 1350),
        (
            {"target": 1460 + ELIDED_TOKENS, "min_tail_messages": 2},
            (1, 1),
            View(1, 0, 8),
            400 + 2 * ELIDED_TOKENS,
        ),
        (
            {"target": 1460 + ELIDED_TOKENS, "elide_min_tokens": 1001},
            (1, 4),
            View(4, 100, 6),
            1400,
        ),
        # A 5000-token summary would cost more than it saves: elision only.
        (
            {"target": 1000, "summary_allowance": 5000},
            (1, 1),
            View(1, 0, 6),
            1400 + ELIDED_TOKENS,
        ),
    ],
)
def test_plan_elides_before_summarizing(
    changes: dict[str, int], summarize: tuple[int, int], view: View, tokens: int
) -> None:
    plan = plan_compaction(
        measured(_AGENT, _AGENT_COUNTS, 1), View(1, 0, 1), agent_budget(**changes)
    )
    assert (plan.action, plan.summarize, plan.view, plan.tokens) == (
        "compact",
        summarize,
        view,
        tokens,
    )


def test_plan_never_lowers_an_existing_elision() -> None:
    current = View(1, 0, 8)
    b = agent_budget(target=500)
    plan = plan_compaction(measured(_AGENT, _AGENT_COUNTS, 1), current, b, force=True)
    assert plan.view.elide_before == 8


# --- force and hysteresis -----------------------------------------------------------------


def test_force_compacts_under_the_trigger() -> None:
    b = budget(trigger=10_000, target=2000)
    assert plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), _FRESH, b).action == "keep"
    plan = plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), _FRESH, b, force=True)
    # Everything before the protected tail of four messages.
    assert (plan.action, plan.summarize, plan.tokens) == ("compact", (1, 4), 650)


def test_force_goes_past_the_protected_tail_when_the_target_needs_it() -> None:
    b = budget(trigger=10_000, target=450)
    plan = plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), _FRESH, b, force=True)
    assert (plan.summarize, plan.tokens) == ((1, 6), 450)


@pytest.mark.parametrize(
    ("spec", "counts", "current"),
    [
        ("s u", [10, 10], View(1, 0, 1)),
        ("s u a u", [10, 10, 10, 10], View(3, 100, 3)),
        ("u", [10], View(0, 0, 0)),
        ("s u c1 t", [10, 10, 10, 10], View(2, 100, 2)),
    ],
)
def test_force_keeps_when_nothing_can_be_summarized(
    spec: str, counts: list[int], current: View
) -> None:
    b = budget(trigger=10_000, target=5000)
    plan = plan_compaction(
        measured(convo(spec), counts, 1 if spec.startswith("s") else 0), current, b
    )
    forced = plan_compaction(
        measured(convo(spec), counts, 1 if spec.startswith("s") else 0), current, b, force=True
    )
    assert plan.action == forced.action == "keep"
    assert forced.view == current
    assert forced.summarize == (current.covered, current.covered)


def test_hysteresis_next_turns_do_not_refire() -> None:
    b = budget(trigger=899, target=500)
    plan = plan_compaction(measured(_CHAT, _CHAT_COUNTS, 1), _FRESH, b)
    assert plan.tokens <= b.target
    grown = [*_CHAT, *convo("a u")]
    counts = [*_CHAT_COUNTS, 100, 100]
    again = plan_compaction(measured(grown, counts, 1), plan.view, b)
    assert (again.action, again.tokens) == ("keep", 650)
    grown += convo("a u a u")
    counts += [100] * 4
    assert plan_compaction(measured(grown, counts, 1), plan.view, b).action == "compact"


# --- trim_plan ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "limit", "expected"),
    [
        (View(1, 0, 1), 900, View(1, 0, 4)),  # fits after elision: nothing dropped
        # 100 + 30 (marker) + 100 * (8 - c) + 100 <= 500 from c = 6.
        (View(1, 0, 1), 500, View(6, 30, 4)),
        (View(1, 0, 1), 430, View(6, 30, 4)),
        (View(1, 0, 1), 429, View(7, 30, 4)),
        (View(1, 0, 1), 10, View(7, 30, 4)),  # the newest group always stays
        (View(3, 200, 3), 500, View(7, 230, 4)),  # the old summary stays in front
        (View(3, 200, 3), 530, View(7, 230, 4)),
        (View(3, 200, 3), 630, View(6, 230, 4)),
    ],
)
def test_trim_plan_drops_oldest_groups(current: View, limit: int, expected: View) -> None:
    assert trim_plan(measured(_CHAT, _CHAT_COUNTS, 1), current, budget(), limit) == expected


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (1460 + ELIDED_TOKENS, View(1, 0, 6)),
        (1000, View(8, 30, 6)),  # cut 8 is the first that fits: 50 + 30 + 100
        (100, View(9, 30, 6)),
    ],
)
def test_trim_plan_elides_first_and_never_splits_groups(limit: int, expected: View) -> None:
    view = trim_plan(measured(_AGENT, _AGENT_COUNTS, 1), View(1, 0, 1), agent_budget(), limit)
    assert view == expected


@pytest.mark.parametrize(
    ("counts", "pinned", "current"),
    [
        ([1, 1, 1], 1, View(1, 0, 1)),  # counts do not match the messages
        ([1, 1, 1, 1], 2, View(1, 0, 1)),  # view starts inside the pinned messages
        ([1, 1, 1, 1], 1, View(4, 10, 4)),  # view covers the newest message
    ],
)
def test_invalid_views_are_rejected(counts: list[int], pinned: int, current: View) -> None:
    messages = convo("s u a u")
    with pytest.raises(ValueError, match=r"."):
        plan_compaction(measured(messages, counts, pinned), current, budget())
    with pytest.raises(ValueError, match=r"."):
        trim_plan(measured(messages, counts, pinned), current, budget(), 100)


# --- properties ---------------------------------------------------------------------------


@st.composite
def scripts(draw: st.DrawFn) -> list[ChatMessage]:
    """Arbitrary (not necessarily alternating) histories with complete tool groups."""
    tokens = draw(st.lists(st.sampled_from(["s", "d"]), max_size=2))
    for _ in range(draw(st.integers(1, 14))):
        group = draw(st.sampled_from(["u", "u", "a", "s", "c1", "c2", "c3"]))
        tokens.append(group)
        if group.startswith("c"):
            tokens += ["t"] * int(group[1:])
    return convo(" ".join(tokens))


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[ChatMessage], list[int], int, View, Budget]:
    messages = draw(scripts())
    n = len(messages)
    counts = draw(st.lists(st.integers(1, 2000), min_size=n, max_size=n))
    pinned = count_pinned(messages, draw(st.booleans()))
    legal = [i for i in range(pinned + 1, n) if messages[i]["role"] != "tool"]
    covered = draw(st.sampled_from([pinned, *legal]))
    summary = draw(st.integers(1, 3000)) if covered > pinned else 0
    current = View(covered, summary, draw(st.integers(pinned, n - 1)))
    window = draw(st.integers(1000, 60_000))
    trigger = draw(st.integers(window // 4, window))
    b = Budget(
        window=window,
        reserve=draw(st.integers(0, window // 8)),
        fixed=draw(st.integers(0, window // 8)),
        trigger=trigger,
        target=draw(st.integers(trigger // 4, trigger - 1)),
        summary_allowance=draw(st.integers(10, 1500)),
        min_tail_messages=draw(st.integers(0, 6)),
        elide_min_tokens=draw(st.integers(1, 1500)),
    )
    return messages, counts, pinned, current, b


def oracle_tokens(
    counts: Sequence[int], messages: Sequence[ChatMessage], pinned: int, view: View, b: Budget
) -> int:
    n = len(messages)
    total = b.fixed + b.reserve + sum(counts[:pinned])
    total += view.summary_tokens if view.covered > pinned else 0
    for i in range(view.covered, n):
        bulky = messages[i]["role"] == "tool" and counts[i] >= b.elide_min_tokens
        total += ELIDED_TOKENS if bulky and i < view.elide_before and i != n - 1 else counts[i]
    return total


def protected_start(messages: Sequence[ChatMessage], b: Budget) -> int:
    i = max(len(messages) - max(b.min_tail_messages, 1), 0)
    while i > 0 and messages[i]["role"] == "tool":
        i -= 1
    return i


@PROPERTY
@given(situations(), st.booleans())
def test_plan_properties(
    situation: tuple[list[ChatMessage], list[int], int, View, Budget], force: bool
) -> None:
    messages, counts, pinned, current, b = situation
    n = len(messages)
    plan = plan_compaction(measured(messages, counts, pinned), current, b, force=force)
    view = plan.view

    assert plan.tokens == oracle_tokens(counts, messages, pinned, view, b)
    assert plan.fits == (plan.tokens <= b.window)
    assert plan.summarize == (current.covered, view.covered)
    before = oracle_tokens(counts, messages, pinned, current, b)
    elided = replace(current, elide_before=max(current.elide_before, protected_start(messages, b)))
    cuts = [c for c in range(current.covered + 1, n) if messages[c]["role"] != "tool"]
    options = [elided] + [View(c, b.summary_allowance, elided.elide_before) for c in cuts]
    costs = {v: oracle_tokens(counts, messages, pinned, v, b) for v in options}
    reachable = [v for v, cost in costs.items() if cost <= b.target]
    if plan.action == "keep":
        assert view == current
        if not force:
            # Under the trigger, or nothing at all would make the request smaller.
            assert before <= b.trigger or min(costs.values()) >= before
        else:
            assert not cuts
        return
    assert force or before > b.trigger

    # The newest group stays verbatim and no tool group is split.
    assert current.covered <= view.covered < n
    assert view.covered == current.covered or messages[view.covered]["role"] != "tool"
    moved = view.covered > current.covered
    assert view.summary_tokens == (b.summary_allowance if moved else current.summary_tokens)
    assert view.elide_before == elided.elide_before

    # Reaches the target whenever elision alone or some legal cut can. A forced
    # compaction folds in at least everything before the protected tail, even when
    # that summary costs more than the little it replaces; so it is held only to
    # the cuts at or past that floor.
    if force:
        floor = max([c for c in cuts if c <= protected_start(messages, b)], default=0)
        reachable = [v for v in reachable if v.covered > current.covered and v.covered >= floor]
    if reachable:
        assert plan.tokens <= b.target
    if not force and plan.tokens <= b.target and view.covered > current.covered:
        # The smallest such cut: every earlier cut misses the target (and elision alone did).
        assert all(v.covered >= view.covered for v in reachable)

    # Hysteresis: once at the target, the same history does not re-fire.
    if plan.tokens <= b.target:
        assert plan_compaction(measured(messages, counts, pinned), view, b).action == "keep"


@PROPERTY
@given(situations(), st.integers(0, 40_000))
def test_trim_plan_properties(
    situation: tuple[list[ChatMessage], list[int], int, View, Budget], limit: int
) -> None:
    messages, counts, pinned, current, b = situation
    n = len(messages)
    view = trim_plan(measured(messages, counts, pinned), current, b, limit)
    assert current.covered <= view.covered < n
    assert view.covered == current.covered or messages[view.covered]["role"] != "tool"
    tokens = oracle_tokens(counts, messages, pinned, view, b)
    if view.covered > current.covered:
        carried = current.summary_tokens if current.covered > pinned else 0
        assert view.summary_tokens == carried + 30
        # Dropped as few groups as needed: one group fewer did not fit.
        fewer = [c for c in range(current.covered, view.covered) if messages[c]["role"] != "tool"]
        previous = max(fewer)
        shorter = (
            View(previous, carried + 30, view.elide_before)
            if previous > current.covered
            else replace(view, covered=current.covered, summary_tokens=current.summary_tokens)
        )
        assert oracle_tokens(counts, messages, pinned, shorter, b) > limit
    else:
        assert view.summary_tokens == current.summary_tokens
    last_group = max(i for i in range(n) if i == 0 or messages[i]["role"] != "tool")
    assert tokens <= limit or view.covered in (last_group, current.covered)


@st.composite
def any_views(draw: st.DrawFn) -> tuple[list[ChatMessage], list[int], int, View, Budget]:
    """Any view of a history, legal or not: ``Totals`` must agree with the definition anyway."""
    messages, counts, pinned, _, b = draw(situations())
    n = len(messages)
    covered = draw(st.integers(pinned, n + 1))
    view = View(covered, draw(st.integers(0, 3000)), draw(st.integers(0, n + 2)))
    return messages, counts, pinned, view, b


@PROPERTY
@given(any_views())
def test_prefix_sum_totals_equal_the_straightforward_count(
    situation: tuple[list[ChatMessage], list[int], int, View, Budget],
) -> None:
    messages, counts, pinned, view, b = situation
    expected = oracle_tokens(counts, messages, pinned, view, b)
    assert Totals.build(measured(messages, counts, pinned), b).tokens(view) == expected
    assert view_tokens(measured(messages, counts, pinned), view, b) == expected


# --- scale --------------------------------------------------------------------------------


class Reads(Sequence[T]):
    """A sequence that counts how many of its items the planner reads."""

    def __init__(self, items: list[T], tally: list[int]) -> None:
        self._items = items
        self._tally = tally

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            part = self._items[i]
            self._tally[0] += len(part)
            return part
        self._tally[0] += 1
        return self._items[i]

    def __iter__(self) -> Iterator[T]:
        for item in self._items:
            self._tally[0] += 1
            yield item


def read_counted(messages: list[ChatMessage], counts: list[int], reads: list[int]) -> History:
    """The history of ``messages`` whose counts and result flags tally their reads."""
    results = Reads(result_flags(messages), reads)  # type: ignore[arg-type]
    return History(messages, [], Reads(counts, reads), 1, 0, results)  # type: ignore[arg-type]


def agent_history(n: int) -> tuple[list[ChatMessage], list[int]]:
    """``n`` messages: system prompt, then user / tool call / bulky result / answer rounds."""
    messages = convo("s " + " ".join(["u c1 t a"] * (n // 4)))[:n]
    counts = [900 if m["role"] == "tool" else 20 for m in messages]
    return messages, counts


@pytest.mark.parametrize("n", [1_000, 4_000, 50_000])
def test_planning_reads_each_message_a_bounded_number_of_times(n: int) -> None:
    """Planning is linear: a 50,000-message history must not freeze the event loop."""
    messages, counts = agent_history(n)
    # A target only the last few groups fit under: the cut search has to go far.
    b = budget(window=10**9, trigger=1000, target=3000, summary_allowance=100)
    for force in (False, True):
        reads = [0]
        plan = plan_compaction(read_counted(messages, counts, reads), _FRESH, b, force=force)
        assert plan.view.covered > 0.9 * n
        assert reads[0] <= 12 * n
    reads = [0]
    view = trim_plan(read_counted(messages, counts, reads), _FRESH, b, b.target)
    assert view.covered > 0.9 * n
    assert reads[0] <= 12 * n
