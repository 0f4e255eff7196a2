"""rebuild.py: the outgoing messages, and every plan + rebuild against invariants 1, 3, 4 and 5."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.budget import Budget
from proxy.core.history import History, count_pinned, result_flags
from proxy.core.omitted import elided_values
from proxy.core.plan import plan_compaction
from proxy.core.rebuild import rebuild_messages
from proxy.core.view import ELIDED_TOKENS, View
from proxy.core.wording import (
    ACKNOWLEDGEMENT,
    CONTINUE,
    SummaryRole,
    elided_content,
    handoff_text,
    omitted_marker,
)
from proxy.simulator.errors import SimError
from proxy.simulator.validate import check_alternation, check_tool_pairing
from proxy.types import ChatMessage, ToolCall
from tests.support.conversations import convo, measured
from tests.support.examples import examples

PROPERTY = settings(
    max_examples=examples(300),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SUMMARY = "Active task: ship the proxy. Critical values: port 8080."


def rebuild(
    messages: Sequence[ChatMessage],
    pinned: int,
    view: View,
    summary: str | None,
    counts: Sequence[int],
    elide_min_tokens: int,
    *,
    summary_role: SummaryRole = "user",
) -> list[ChatMessage]:
    history = History(messages, [b""] * len(messages), counts, pinned, 0, result_flags(messages))
    return rebuild_messages(history, view, summary, elide_min_tokens, summary_role=summary_role)


def roles(messages: Sequence[ChatMessage]) -> list[str]:
    return [m["role"] for m in messages]


def as_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], list(messages))


# --- summary placement --------------------------------------------------------------------

H, ACK, CONT = "H", "ACK", "CONT"


@pytest.mark.parametrize(
    ("spec", "pinned", "covered", "summary_role", "expected"),
    [
        # Nothing or a system block before, a user turn after: handoff + acknowledgement.
        ("s u a u", 1, 3, "user", ["s", "user:H", "assistant:ACK", "u"]),
        ("d u a u", 1, 3, "user", ["d", "user:H", "assistant:ACK", "u"]),
        ("u a u", 0, 2, "user", ["user:H", "assistant:ACK", "u"]),
        # ...an assistant turn after: the handoff is the user turn before it.
        ("s u a u", 1, 2, "user", ["s", "user:H", "a", "u"]),
        ("u a u", 0, 1, "user", ["user:H", "a", "u"]),
        # The pinned first user message before, a user turn after: the assistant hands off.
        ("s u a u a u", 2, 3, "user", ["s", "u", "assistant:H", "u", "a", "u"]),
        # ...an assistant turn after: the assistant hands off and the user says continue.
        ("s u a u a u", 2, 4, "user", ["s", "u", "assistant:H", "user:CONT", "a", "u"]),
        # A system message opening the tail counts as a user turn.
        ("s u a s u", 1, 3, "user", ["s", "user:H", "assistant:ACK", "s", "u"]),
        ("s u a u a s u", 2, 5, "user", ["s", "u", "assistant:H", "s", "u"]),
        # System handoffs stay inside the leading block, before a user turn.
        ("s u a u", 1, 3, "system", ["s", "system:H", "u"]),
        ("u a u", 0, 2, "system", ["system:H", "u"]),
        ("s u a u", 1, 2, "system", ["s", "user:H", "a", "u"]),
        ("s u a u a u", 2, 3, "system", ["s", "u", "assistant:H", "u", "a", "u"]),
        ("s u a u a u", 2, 4, "system", ["s", "u", "assistant:H", "user:CONT", "a", "u"]),
    ],
)
def test_summary_placement_keeps_roles_alternating(
    spec: str, pinned: int, covered: int, summary_role: SummaryRole, expected: list[str]
) -> None:
    messages = convo(spec)
    view = View(covered, 100, covered)
    out = rebuild(
        messages, pinned, view, SUMMARY, [10] * len(messages), 400, summary_role=summary_role
    )
    texts = {handoff_text(SUMMARY): H, ACKNOWLEDGEMENT: ACK, CONTINUE: CONT}
    short = {"system": "s", "developer": "d", "user": "u", "assistant": "a"}
    described = []
    originals = iter(messages[:pinned] + messages[covered:])
    for message in out:
        content = message.get("content")
        if isinstance(content, str) and content in texts:
            described.append(f"{message['role']}:{texts[content]}")
            assert set(message) == {"role", "content"}
        else:
            assert message is next(originals)
            described.append(short[message["role"]])
    assert described == expected


def test_no_summary_when_nothing_is_covered() -> None:
    messages = convo("s u a u")
    out = rebuild(messages, 1, View(1, 500, 1), SUMMARY, [10] * 4, 400)
    assert len(out) == len(messages)
    assert all(a is b for a, b in zip(out, messages, strict=True))


def test_a_covering_view_without_summary_is_rejected() -> None:
    with pytest.raises(ValueError, match="summary"):
        rebuild(convo("s u a u"), 1, View(3, 100, 3), None, [10] * 4, 400)


@pytest.mark.parametrize(
    ("pinned", "view"),
    [(2, View(1, 0, 1)), (1, View(4, 0, 4)), (1, View(9, 0, 9))],
)
def test_invalid_views_are_rejected(pinned: int, view: View) -> None:
    with pytest.raises(ValueError, match="covers"):
        rebuild(convo("s u a u"), pinned, view, SUMMARY, [10] * 4, 400)


def test_summary_messages_are_byte_identical_between_compactions() -> None:
    """Invariant 5: new turns do not change the prefix the upstream sees."""
    messages = convo("s u a u a u")
    view = View(3, 100, 3)
    first = rebuild(messages, 2, view, SUMMARY, [10] * 6, 400)
    grown = [*copy.deepcopy(messages), *convo("a u")]
    second = rebuild(grown, 2, view, SUMMARY, [10] * 8, 400)
    prefix = len(first) - (len(messages) - view.covered)
    assert orjson.dumps(first[:prefix]) == orjson.dumps(second[:prefix])
    assert first[prefix:] == second[prefix : len(first)]


def test_handoff_text_frames_the_summary_deterministically() -> None:
    text = handoff_text(SUMMARY)
    assert text == handoff_text(SUMMARY)
    assert f"<summary>\n{SUMMARY}\n</summary>" in text
    assert text.index("compacted") < text.index(SUMMARY)
    assert handoff_text("other") != text


# --- elision ------------------------------------------------------------------------------


def test_elided_tool_output_is_a_copy_with_a_placeholder() -> None:
    messages = convo("s u c2 t t a u")
    messages[3]["name"] = "grep"
    original = copy.deepcopy(messages)
    counts = [10, 20, 30, 1234, 399, 40, 50]
    out = rebuild(messages, 1, View(1, 0, 5), None, counts, 400)
    assert messages == original  # nothing mutated
    assert out[3] is not messages[3]
    assert out[3] == {
        "role": "tool",
        "tool_call_id": "call_2_0",
        "name": "grep",
        "content": elided_content(messages[3], 1234),
    }
    assert "1234 tokens" in cast(str, out[3]["content"])
    assert out[4] is messages[4]  # below elide_min_tokens
    assert [a is b for a, b in zip(out, messages, strict=True)] == [1, 1, 1, 0, 1, 1, 1]


def test_elision_respects_the_boundary_and_the_summary() -> None:
    messages = convo("s u c1 t c1 t u")
    counts = [10, 10, 10, 800, 10, 800, 10]
    out = rebuild(messages, 1, View(4, 100, 5), SUMMARY, counts, 400)
    # Result 3 is summarised, result 5 is at the boundary: kept verbatim.
    assert out[-3:] == messages[4:]
    assert all(a is b for a, b in zip(out[-3:], messages[4:], strict=True))


def test_the_newest_message_is_never_elided() -> None:
    messages = convo("s u c1 t")
    out = rebuild(messages, 1, View(1, 0, 99), None, [10, 10, 10, 5000], 400)
    assert out[-1] is messages[-1]


@pytest.mark.parametrize(("count", "word"), [(1, "message was"), (7, "messages were")])
def test_omitted_marker_is_one_line(count: int, word: str) -> None:
    marker = omitted_marker(count)
    assert "\n" not in marker
    assert f"{count} earlier {word} omitted" in marker


# --- every plan + rebuild -----------------------------------------------------------------


@st.composite
def contents(draw: st.DrawFn) -> str | list[dict[str, Any]]:
    text = draw(st.text(max_size=12))
    if draw(st.booleans()):
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if draw(st.booleans()):
        parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}})
    return parts


@st.composite
def histories(draw: st.DrawFn) -> list[ChatMessage]:
    """Valid histories; alternating by construction, then maybe perturbed."""
    messages: list[ChatMessage] = [
        {"role": role, "content": draw(contents())}
        for role in draw(st.lists(st.sampled_from(["system", "developer"]), max_size=2))
    ]
    turns = draw(st.integers(1, 7))
    ends_with_tool = draw(st.booleans())
    for turn in range(turns):
        messages.append({"role": "user", "content": draw(contents())})
        last = turn == turns - 1
        if last and not ends_with_tool:
            break
        for _ in range(draw(st.integers(1 if last else 0, 2))):
            ids = [f"call_{len(messages)}_{k}" for k in range(draw(st.integers(1, 3)))]
            calls: list[ToolCall] = [
                {"id": i, "type": "function", "function": {"name": "run", "arguments": "{}"}}
                for i in ids
            ]
            text = draw(st.one_of(st.none(), st.text(max_size=5)))
            messages.append({"role": "assistant", "content": text, "tool_calls": calls})
            for i in draw(st.permutations(ids)):
                messages.append({"role": "tool", "tool_call_id": i, "content": draw(contents())})
        if not last:
            messages.append({"role": "assistant", "content": draw(contents())})
    if not draw(st.booleans()):
        # Break alternation: extra turns anywhere a tool block is not interrupted.
        for _ in range(draw(st.integers(1, 3))):
            spots = [i for i in range(1, len(messages)) if messages[i]["role"] != "tool"]
            if spots:
                at = draw(st.sampled_from(spots))
                role = draw(st.sampled_from(["user", "assistant", "system"]))
                messages.insert(at, {"role": role, "content": draw(contents())})
    return messages


def check_structure(messages: Sequence[ChatMessage]) -> None:
    """OpenAI's pairing rules, written independently of the simulator's validator."""
    asked: set[str] = set()  # the calls of the assistant message the tool block answers
    pending: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert asked, "a tool result without a preceding assistant tool_calls"
            assert message.get("tool_call_id") in asked, "answers another message's call"
            pending.discard(message.get("tool_call_id", ""))
            continue
        assert not pending, "tool_calls left unanswered"
        asked = {call["id"] for call in message.get("tool_calls", [])}
        pending = set(asked)
    assert not pending, "tool_calls left unanswered at the end"


def alternates(messages: Sequence[ChatMessage]) -> bool:
    try:
        check_alternation(as_dicts(messages))
    except SimError:
        return False
    return True


def expected_tokens(
    counts: Sequence[int],
    messages: Sequence[ChatMessage],
    out: Sequence[ChatMessage],
    pinned: int,
    view: View,
    b: Budget,
) -> int:
    """Tokens of the rebuilt request, recomputed from what it actually contains."""
    tail = len(messages) - view.covered
    total = sum(counts[:pinned]) + b.fixed + b.reserve
    if len(out) - pinned - tail > 0:  # summary messages were inserted
        total += view.summary_tokens
    for i, sent in zip(range(view.covered, len(messages)), out[len(out) - tail :], strict=True):
        if sent is messages[i]:
            total += counts[i]
        else:
            # Random text may hold a value (an id of unicode letters and digits): the
            # placeholder then quotes it (test_values.py checks which).
            held = elided_values(messages[i], b"")
            content = elided_content(messages[i], counts[i], held)
            assert sent == {**messages[i], "content": content}
            assert messages[i]["role"] == "tool"
            assert counts[i] >= b.elide_min_tokens
            assert i < view.elide_before
            total += ELIDED_TOKENS
    return total


@st.composite
def budgets(draw: st.DrawFn) -> Budget:
    window = draw(st.integers(1000, 60_000))
    trigger = draw(st.integers(window // 4, window))
    return Budget(
        window=window,
        reserve=draw(st.integers(0, window // 8)),
        fixed=draw(st.integers(0, window // 8)),
        trigger=trigger,
        target=draw(st.integers(trigger // 4, trigger - 1)),
        summary_allowance=draw(st.integers(10, 1500)),
        min_tail_messages=draw(st.integers(0, 6)),
        elide_min_tokens=draw(st.integers(1, 1500)),
    )


@PROPERTY
@given(st.data(), histories(), budgets())
def test_every_plan_rebuilds_to_a_valid_request(
    data: st.DataObject, messages: list[ChatMessage], b: Budget
) -> None:
    n = len(messages)
    counts = data.draw(st.lists(st.integers(1, 2000), min_size=n, max_size=n))
    pinned = count_pinned(messages, data.draw(st.booleans()))
    legal = [i for i in range(pinned + 1, n) if messages[i]["role"] != "tool"]
    covered = data.draw(st.sampled_from([pinned, *legal]))
    current = View(
        covered,
        data.draw(st.integers(1, 3000)) if covered > pinned else 0,
        data.draw(st.integers(pinned, n - 1)),
    )
    summary_role: SummaryRole = data.draw(st.sampled_from(["user", "system"]))
    original = copy.deepcopy(messages)
    check_structure(messages)
    check_tool_pairing(as_dicts(messages))

    plan = plan_compaction(
        measured(messages, counts, pinned), current, b, force=data.draw(st.booleans())
    )
    view = plan.view
    summary = SUMMARY if view.covered > pinned else None
    out = rebuild(
        messages, pinned, view, summary, counts, b.elide_min_tokens, summary_role=summary_role
    )

    assert messages == original  # the client's history is never mutated
    # (a) the newest message, verbatim, last; (b) the pinned messages, verbatim, first.
    assert out[-1] is messages[-1]
    assert all(a is b for a, b in zip(out[:pinned], messages[:pinned], strict=True))
    # (e) the kept span starts on a group boundary: no orphaned results.
    assert view.covered == pinned or messages[view.covered]["role"] != "tool"
    inserted = len(out) - pinned - (n - view.covered)
    assert 0 <= inserted <= 2
    assert (inserted > 0) == (summary is not None)
    # (c) valid under OpenAI's structure rules, by two independent checkers.
    check_structure(out)
    check_tool_pairing(as_dicts(out))
    # (d) strict alternation survives wherever the client's history had it.
    if alternates(messages):
        check_alternation(as_dicts(out))
    # (f) the plan's estimate is what the rebuilt request contains.
    assert expected_tokens(counts, messages, out, pinned, view, b) == plan.tokens
    # (g) at the target whenever the tail past the newest group allows it: summarising
    # everything but the newest group, with every old bulky output elided, is the floor.
    newest_group = max(i for i in range(n) if messages[i]["role"] != "tool")
    if newest_group > current.covered:
        floor = sum(counts[:pinned]) + b.fixed + b.reserve + b.summary_allowance
        floor += sum(counts[newest_group:])
        if floor <= b.target and plan.action == "compact":
            assert plan.tokens <= b.target
    # Invariant 5: the same view and summary always rebuild the same bytes.
    again = rebuild(
        messages, pinned, view, summary, counts, b.elide_min_tokens, summary_role=summary_role
    )
    assert orjson.dumps(again) == orjson.dumps(out)
