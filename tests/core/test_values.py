"""Labelled values (values.py): found in prose, settings and tool output, quoted with
their label and role by the identifier check, a trimmed view's digest and elision."""

from __future__ import annotations

import pytest

from proxy.core.budget import Budget
from proxy.core.digest import digests_and_sizes
from proxy.core.history import History, result_flags
from proxy.core.identifiers import restore_identifiers
from proxy.core.omitted import elided_values, omitted_recap, recap_tokens
from proxy.core.snapshot import Loaded
from proxy.core.trim import trim_outcome
from proxy.core.values import find_values
from proxy.core.wording import CARRIED_HEADING, OMITTED_HEADING, QUOTED_INTRO
from proxy.types import ChatMessage


def shown(text: str) -> list[str]:
    return [value.shown for value in find_values(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Please file it under ticket id: TCK-90417 today.", "ticket id: TCK-90417"),
        ("OK, so the port is 8443 on staging.", "port: 8443"),
        ("We shipped build number 48213 yesterday.", "build: 48213"),
        ("They approved a budget of $37,500 for it.", "budget: $37,500"),
        ("the budget is 37,500 dollars", "budget: 37,500 dollars"),
        ("The report is due 2026-03-14, no later.", "due: 2026-03-14"),
        ("launch date March 14, 2026 it is", "launch date: March 14, 2026"),
        # A real-model bench fact that no rule read (issue 21's run F): never recalled.
        ("The public launch date has been fixed: 2027-03-22.", "launch date: 2027-03-22"),
        ("The owner is Dana Whitfield, ask her.", "owner: Dana Whitfield"),
        ("our codename is Bluefin", "codename: Bluefin"),
        ("export SERVER_PORT = 7781", "SERVER_PORT = 7781"),
        ("DB_HOST = db.internal", "DB_HOST = db.internal"),
        ("set SERVER_PORT to 7781 please", "SERVER_PORT: 7781"),
        ("server.port: 8443", "server.port: 8443"),
        ("set PORT=8080, then", "PORT=8080"),
        # One-word constants with spaces round "=" (the 1.5B agent bench's settings).
        ("BUCKET = s3-archive-17\n", "BUCKET = s3-archive-17"),
        ("TIMEOUT = 30\n", "TIMEOUT = 30"),
        # The label a name belongs to is the one before "for this project", not project.
        ("the release manager for this project is Tobias Moreau.", "manager: Tobias Moreau"),
        ("the contact of the team is Ann Lee", "contact: Ann Lee"),
        ("order id 5512 shipped", "order id: 5512"),
        ("Issue #4711 is open", "issue: 4711"),
    ],
)
def test_labelled_values_are_found_with_their_label(text: str, expected: str) -> None:
    assert expected in shown(text)


def test_a_constant_with_a_value_is_a_setting_not_an_error_code() -> None:
    """``SERVER_PORT`` alone matched the error-code rule and lost its value."""
    found = find_values("config: SERVER_PORT = 7781 and ERR_SSL_PROTOCOL again")
    assert [v.shown for v in found] == ["SERVER_PORT = 7781", "ERR_SSL_PROTOCOL"]
    assert found[0].labelled
    assert not found[1].labelled


@pytest.mark.parametrize(
    "text",
    [
        "I counted 8443 sheep and 17 goats in 2024.",  # numbers without a label
        "We talked for 45 minutes about 3 options on 12 screens.",
        "due to 38 failures we stopped",  # a reason, not a date
        "order 66 was executed",  # "order" labels only with "id"
        "we need to build 2 more",  # one digit is not a value
        "the port is open and the owner is unknown",  # labels without values
        "for i in range(10): x = foo(bar); i = 0",  # code, not settings
        "version 1.2.3 on 2024-01-01",
    ],
)
def test_prose_numbers_without_a_label_are_not_values(text: str) -> None:
    assert find_values(text) == []


@pytest.mark.parametrize(
    ("text", "never"),
    [
        ("DB_PASSWORD = hunter2 and the port is 8443", "hunter2"),
        ("API_TOKEN: abc123def and build 48213", "abc123def"),
        ("host is https://user:pw@db.internal:5432/x?token=s3cr3t", "pw@"),
    ],
)
def test_secrets_are_neither_values_nor_context(text: str, never: str) -> None:
    for value in find_values(text):
        assert never not in value.shown
        assert never not in value.context


def test_a_value_keeps_a_few_words_of_its_sentence() -> None:
    text = "Earlier stuff. So for the record the ticket id is TCK-90417 for the outage on Monday."
    (value,) = find_values(text)
    assert value.context == "So for the record the ticket id is TCK-90417 for the outage on Monday"
    (bare,) = find_values("retry call_8f3a2c later")
    assert bare.context == "retry call_8f3a2c later"


def test_restored_values_carry_their_label_or_their_words() -> None:
    """A bare ``- TCK-90417`` was answered with 12345: a restored value says what it is."""
    sources = [
        ("user", "The ticket id is TCK-90417 and the port is 8443."),
        ("tool", "SERVER_PORT = 7781\nretry call_8f3a2c later"),
    ]
    result = restore_identifiers("## Goal\nFix it on port 8443.", sources, 1000)
    carried = result.summary.split(CARRIED_HEADING, 1)[1]
    assert "- user: `ticket id: TCK-90417`\n" in carried
    assert "- tool: `SERVER_PORT = 7781`\n" in carried
    assert "- tool: `call_8f3a2c` (from `retry call_8f3a2c later`)" in carried
    assert "8443" not in carried  # the summary kept it
    # Carried forward as they are, role and label, into the next summary.
    again = restore_identifiers("## Goal\nport 8443", [("summary", result.summary)], 1000)
    assert again.summary.split(CARRIED_HEADING, 1)[1] == carried


NO_DIGESTS = [b""] * 4  # no digest: nothing kept between calls


def test_a_digest_quotes_values_with_role_and_words_within_its_bounds() -> None:
    dropped: list[ChatMessage] = [
        {"role": "user", "content": "Hi. The ticket id is TCK-90417 for this."},
        {"role": "assistant", "content": "Noted: the port is 8443 on staging."},
        {"role": "tool", "tool_call_id": "c1", "content": "SERVER_PORT = 7781\nlog = debug"},
        {"role": "user", "content": "we had 42 of them"},
    ]
    digest = omitted_recap(dropped, NO_DIGESTS, "", 1000, 10)
    assert digest.splitlines() == [
        OMITTED_HEADING,
        "- user: `ticket id: TCK-90417` (from `The ticket id is TCK-90417 for this`)",
        "- assistant: `port: 8443` (from `Noted: the port is 8443 on staging`)",
        "- tool: `SERVER_PORT = 7781`",
    ]
    # Values the kept summary already has are not quoted twice.
    assert "TCK-90417" not in omitted_recap(dropped, NO_DIGESTS, "ticket TCK-90417", 1000, 10)
    # Bounded: the most recent first, context dropped before a value is.
    assert omitted_recap(dropped, NO_DIGESTS, "", 1000, 1).splitlines()[1:] == [
        "- tool: `SERVER_PORT = 7781`"
    ]
    small = omitted_recap(dropped, NO_DIGESTS, "", len(OMITTED_HEADING) + 60, 10)
    assert len(small) <= len(OMITTED_HEADING) + 60
    assert small.splitlines()[1:] == ["- assistant: `port: 8443`", "- tool: `SERVER_PORT = 7781`"]
    assert omitted_recap(dropped[3:], NO_DIGESTS[3:], "", 1000, 10) == ""


def test_an_elided_output_keeps_its_values_in_reading_order_and_bounded() -> None:
    output = "\n".join(f"KEY_{i} = value-{i}" for i in range(40))
    message: ChatMessage = {"role": "tool", "tool_call_id": "c", "content": output}
    values = elided_values(message, b"")
    assert values.startswith("`KEY_0 = value-0`, `KEY_1 = value-1`")
    assert len(values) <= 160
    assert elided_values({"role": "tool", "tool_call_id": "c", "content": "ok " * 500}, b"") == ""


def _history(messages: list[ChatMessage], counts: list[int]) -> History:
    digests, _ = digests_and_sizes(messages)
    return History(messages, digests, counts, 1, 0, result_flags(messages))


FACTS: list[ChatMessage] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Remember: the ticket id is TCK-90417."},
    {"role": "assistant", "content": "Sure, and the port is 8443."},
    {"role": "user", "content": "filler " * 50},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "filler " * 50},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "What was the ticket id?"},
]


# 1190 tokens with the reply's 20: over an 800 window; cut 5 (480) is the first within a
# 700 target, and leaves room for the digest beside it.
COUNTS = [10, 20, 20, 400, 300, 400, 10, 10]


@pytest.mark.parametrize("role", ["user", "system"])
def test_a_trimmed_view_carries_the_digest_as_quoted_data_never_in_a_system_message(
    role: str,
) -> None:
    h = _history(FACTS, COUNTS)
    budget = Budget(window=800, reserve=20, fixed=0, trigger=750, target=700, summary_allowance=160)
    outcome = trim_outcome(h, Loaded(None, None), budget, role)  # type: ignore[arg-type]
    assert outcome.status == "trimmed"
    assert outcome.messages is not None
    sent = outcome.messages
    quoted = [m for m in sent if OMITTED_HEADING in str(m["content"])]
    assert len(quoted) == 1
    assert quoted[0]["role"] == "user"
    text = str(quoted[0]["content"])
    assert "- user: `ticket id: TCK-90417`" in text
    assert "- assistant: `port: 8443`" in text
    assert all("TCK-90417" not in str(m["content"]) for m in sent if m["role"] == "system")
    if role == "system":
        assert text.startswith(QUOTED_INTRO)
    # Counted: the digest's room is in the view's total, which stays within the target.
    assert outcome.tokens + budget.reserve <= budget.target
    section = text[text.index(OMITTED_HEADING) :].split("\n</summary>")[0]
    assert outcome.tokens >= 10 + 420 + recap_tokens(section)


def test_a_digest_that_does_not_fit_beside_the_tail_drops_one_more_group() -> None:
    h = _history(FACTS, COUNTS)
    roomy = Budget(window=800, reserve=20, fixed=0, trigger=750, target=700, summary_allowance=160)
    tight = Budget(window=800, reserve=20, fixed=0, trigger=750, target=500, summary_allowance=160)
    loose = trim_outcome(h, Loaded(None, None), roomy, "user")
    packed = trim_outcome(h, Loaded(None, None), tight, "user")
    assert loose.messages is not None
    assert packed.messages is not None
    assert len(packed.messages) < len(loose.messages)
    assert OMITTED_HEADING in str(packed.messages[1]["content"])
    assert packed.tokens <= tight.target
