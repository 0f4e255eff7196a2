"""Issue 21 items 2 and 4: a summarizer's answer is checked before it replaces anything
(summary_check.py), and the prompt and budget fit small windows (prompts.py, budget.py).

Answers and prompts are judged as values, and ``summarize`` is driven against a scripted
upstream; the real proxy over HTTP in front of the simulator playing a weak summarizer:
tests/e2e/test_summary_check_e2e.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from proxy.compaction.summarize import summarize
from proxy.config import CompactionSettings, Settings
from proxy.core.budget import summary_limit
from proxy.core.models import ModelTable
from proxy.core.prompts import CORE, FULL, SIMPLE, prompt_for
from proxy.core.summary_check import LEGACY_PLACEHOLDER, SUMMARY_HEADING, check_summary, framed
from proxy.core.transcript import frame_prompt, render_transcript
from proxy.errors import SummaryRejected, SummaryTruncated
from proxy.types import ChatMessage
from tests.support.fakes import FakeUpstream, span, summary_reply
from tests.support.fakes import summary_request as request
from tests.support.faulty_upstream import handoff

GOOD = handoff("Answer the questions about the release plan.")
SPAN_CHARS = 10_000  # forty messages of about 250 characters


# --- the check ----------------------------------------------------------------------------


def test_a_summary_with_its_headings_and_content_passes() -> None:
    assert check_summary(GOOD, CORE, 400, SPAN_CHARS) is None
    full = "\n".join(f"## {s}\nThe release ships on the planned day." for s in FULL.sections)
    assert check_summary(full, FULL, 2000, SPAN_CHARS) is None


def test_headings_in_other_markdown_forms_count() -> None:
    bold = GOOD.replace("## Active task", "**Active task:**").replace(
        "## Current state", "Current state:"
    )
    assert check_summary(bold, CORE, 400, SPAN_CHARS) is None
    numbered = GOOD.replace("## Active task", "### 1. Active task").replace(
        "## Current", "2) Current"
    )
    assert check_summary(numbered, CORE, 400, SPAN_CHARS) is None


def test_the_placeholder_echoed_is_rejected_as_an_echo() -> None:
    """Issue 21: a 19-token echo of the placeholder was stored as version 1."""
    assert check_summary(LEGACY_PLACEHOLDER, FULL, 614, SPAN_CHARS) == "echo"
    assert check_summary(f"## Active task\n{LEGACY_PLACEHOLDER}", CORE, 300, SPAN_CHARS) == "echo"


@pytest.mark.parametrize("prompt", [FULL, CORE, SIMPLE], ids=lambda p: p.name)
def test_the_instructions_echoed_are_rejected(prompt: Any) -> None:
    assert check_summary(prompt.system, prompt, 2000, SPAN_CHARS) == "echo"
    # Copied under real headings, between a real value or two: still an echo.
    guidance = prompt.system.split("\n\n")[0]
    copied = "\n".join(f"## {s}\n{guidance}" for s in prompt.sections) + "\n- port = 8443"
    assert check_summary(copied, prompt, 2000, SPAN_CHARS) == "echo"


# A span whose user turns state facts and whose assistant turns acknowledge them in words
# of their own: what a heading-less summary is judged against.
TURNS = [
    ("user", "The release manager for the launch is Priya Natarajan, please remember."),
    ("assistant", "Understood, I will keep that in mind while we plan the release together."),
    ("user", "Our budget for the quarter is 37,500 dollars and the deadline is March 14."),
    ("assistant", "Noted, I have recorded the budget and the deadline for later reference."),
    ("user", "The service reads its settings from /etc/ledger/service.toml on every host."),
    ("assistant", "Thanks, I will look at that file whenever the configuration comes up."),
]
PROSE = (
    "The user is planning a release. Priya Natarajan manages it; the budget for the "
    "quarter is 37,500 dollars and the deadline is March 14. Settings are read from "
    "/etc/ledger/service.toml on every host. Nothing is blocked; the assistant waits for "
    "the next question."
)


@pytest.mark.parametrize("prompt", [FULL, CORE, SIMPLE], ids=lambda p: p.name)
def test_a_summary_that_keeps_the_facts_without_the_asked_headings_is_kept(prompt: Any) -> None:
    """A summarizer that kept every fact in prose of its own was rejected for its layout
    (``structure``, twice), and the trimmed session lost 29 of 40 facts."""
    assert check_summary(PROSE, prompt, 400, SPAN_CHARS, TURNS) is None
    kept = framed(PROSE, prompt)
    assert kept == f"{SUMMARY_HEADING}\n{PROSE}"  # under the proxy's heading
    assert framed(GOOD, prompt) == GOOD  # a summary with headings is kept as it is
    bold = "**Release**\n" + PROSE
    assert framed(bold, prompt) == bold


def test_a_summary_is_judged_short_by_its_content_not_its_headings() -> None:
    assert check_summary("## Active task\nnone", FULL, 2000, SPAN_CHARS) == "too_short"
    # Headings it was not asked for are no content either.
    unasked = "## Overview\n## Details\n**Notes:**\n### Open items\n- none"
    assert check_summary(unasked, CORE, 400, SPAN_CHARS) == "too_short"
    assert check_summary("Priya runs the launch.", CORE, 400, SPAN_CHARS) == "too_short"


def test_a_copy_of_the_assistants_own_turns_is_rejected() -> None:
    replies = "\n".join(text for role, text in TURNS if role == "assistant")
    assert check_summary(replies, CORE, 400, SPAN_CHARS, TURNS) == "copied"
    under_headings = f"## Active task\n{replies}\n## Critical values\nnone"
    assert check_summary(under_headings, CORE, 400, SPAN_CHARS, TURNS) == "copied"
    # The user's words copied are the facts, kept: not a copy of the replies.
    said = "\n".join(text for role, text in TURNS if role == "user")
    assert check_summary(said, CORE, 400, SPAN_CHARS, TURNS) is None
    # A summary that lifts a reply or two among words of its own is a summary.
    lifted = (
        "Noted, I have recorded the budget and the deadline for later reference. "
        "The user plans the release with Priya Natarajan; the budget for the quarter is "
        "37,500 dollars, due March 14, and the settings file is /etc/ledger/service.toml."
    )
    assert check_summary(lifted, CORE, 400, SPAN_CHARS, TURNS) is None
    # What the previous summary already said is no copy either.
    carried = [("summary", replies), *TURNS]
    assert check_summary(replies, CORE, 400, SPAN_CHARS, carried) is None


def test_an_echo_an_empty_or_cut_answer_without_headings_is_still_rejected() -> None:
    assert check_summary(CORE.system, CORE, 400, SPAN_CHARS, TURNS) == "echo"
    assert check_summary(" \n\n", CORE, 400, SPAN_CHARS, TURNS) == "empty"
    assert check_summary("none\n-\nn/a", CORE, 400, SPAN_CHARS, TURNS) == "too_short"


async def test_a_heading_less_summary_is_kept_not_retried() -> None:
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(PROSE)])
    made = await summarize(request(upstream), "", span())
    assert (made.text, made.rejected, made.calls) == (PROSE, (), 1)


async def test_a_heading_less_answer_cut_off_is_truncated_not_kept() -> None:
    upstream = FakeUpstream()
    cut = summary_reply(PROSE, finish_reason="length")
    upstream.script(summaries=[cut, cut])
    with pytest.raises(SummaryTruncated) as failed:
        await summarize(request(upstream), "", span())
    assert failed.value.rejected == ("truncated", "truncated")


async def test_an_answer_copying_the_assistants_turns_is_asked_for_again() -> None:
    upstream = FakeUpstream()
    messages: list[ChatMessage] = [{"role": r, "content": t} for r, t in TURNS]
    replies = "\n".join(text for role, text in TURNS if role == "assistant")
    upstream.script(summaries=[summary_reply(replies), summary_reply(PROSE)])
    made = await summarize(request(upstream), "", messages)
    assert (made.text, made.rejected) == (PROSE, ("copied",))
    assert systems(upstream) == [CORE.system, SIMPLE.system]


def test_a_degenerately_short_summary_of_a_long_span_is_rejected() -> None:
    bare = "\n".join(f"## {s}\nnone" for s in CORE.sections)
    assert check_summary(bare, CORE, 400, SPAN_CHARS) == "too_short"
    tiny = "## Active task\nship it\n## Critical values\nnone"
    assert check_summary(tiny, CORE, 400, SPAN_CHARS) == "too_short"
    # The same few words for a span of a few words are a fine summary.
    assert check_summary(tiny, CORE, 400, 200) is None


def test_an_empty_answer_is_rejected() -> None:
    assert check_summary("  \n", CORE, 400, SPAN_CHARS) == "empty"


# --- the prompt ---------------------------------------------------------------------------


def test_a_first_compaction_has_no_previous_summary_block_and_no_placeholder() -> None:
    first = frame_prompt("", render_transcript(span(4)))
    assert "previous_summary" not in first
    assert "(none" not in first
    assert "first compaction" not in first
    later = frame_prompt("## Active task\nship", render_transcript(span(4)))
    assert re.search(r"<previous_summary_\w+>\n## Active task\nship\n</previous_summary_", later)


@pytest.mark.parametrize("prompt", [FULL, CORE, SIMPLE], ids=lambda p: p.name)
def test_the_request_names_its_marker_and_the_instructions_explain_the_framing(
    prompt: Any,
) -> None:
    """A real 0.5B model copied the request's framing preamble over and over instead of
    summarizing: the request now names its marker in one line."""
    request = frame_prompt("", render_transcript(span(4)))
    preamble = request[: request.index("<new_turns_")]
    assert re.fullmatch(r"The quoted text uses the marker [0-9a-f]{8}\.\n\n", preamble)
    assert "a line holding the marker and a role" in prompt.system


@pytest.mark.parametrize("prompt", [FULL, CORE, SIMPLE], ids=lambda p: p.name)
def test_section_guidance_is_stated_once_not_under_each_heading(prompt: Any) -> None:
    headings, listed = prompt.system.split("The sections:\n")
    assert "## " not in headings  # the guidance names no heading as a heading
    assert listed.splitlines() == [f"## {s}" for s in prompt.sections]  # bare headings


def test_a_small_budget_asks_for_the_core_sections_only() -> None:
    assert prompt_for(307) is CORE  # 15% of a 2k window
    assert prompt_for(614) is CORE  # 15% of a 4k window: a real 0.5B ran out in all 13
    assert prompt_for(1229) is FULL  # 15% of an 8k window
    assert len(CORE.sections) < len(FULL.sections) // 2
    assert "Critical values" in CORE.sections


def test_the_summary_budgets_share_of_the_window_is_configurable() -> None:
    settings = Settings(models=[{"match": "small", "context_window": 2048}])
    model = ModelTable(settings).resolve("small")
    assert summary_limit(model, settings.compaction) == 307  # 15% by default
    raised = CompactionSettings(summary_budget_ratio=0.3)
    assert summary_limit(model, raised) == 614
    capped = CompactionSettings(summary_budget_ratio=0.3, summary_max_tokens=500)
    assert summary_limit(model, capped) == 500  # summary_max_tokens still caps it
    with pytest.raises(ValidationError):
        CompactionSettings(summary_budget_ratio=0.6)


# --- summarize() against a scripted upstream ------------------------------------------------


def systems(upstream: FakeUpstream) -> list[str]:
    return [c.messages[0]["content"] for c in upstream.summary_calls]


async def test_an_echo_is_asked_for_once_more_with_the_simple_prompt_and_kept_if_good() -> None:
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(CORE.system), summary_reply(GOOD)])
    made = await summarize(request(upstream), "", span())
    assert made.text == GOOD
    assert made.rejected == ("echo",)
    assert systems(upstream) == [CORE.system, SIMPLE.system]
    assert made.calls == 2


async def test_an_echo_cut_off_is_asked_for_with_the_simple_prompt_not_tersely() -> None:
    """A real 0.5B model repeated a framing preamble until its budget ran out: asking it
    to be terse costs a call and gets the same."""
    upstream = FakeUpstream()
    echo = summary_reply(CORE.system, finish_reason="length")
    upstream.script(summaries=[echo, summary_reply(GOOD)])
    made = await summarize(request(upstream), "", span())
    assert (made.text, made.rejected, made.length_retries) == (GOOD, ("echo",), 0)
    assert systems(upstream) == [CORE.system, SIMPLE.system]
    assert "tersely" not in upstream.summary_calls[1].messages[-1]["content"]


async def test_a_second_failed_check_fails_the_summary() -> None:
    upstream = FakeUpstream()
    short = "## Summary\nok\n## Critical values\nnone"
    upstream.script(summaries=[summary_reply(LEGACY_PLACEHOLDER), summary_reply(short)])
    with pytest.raises(SummaryRejected) as failed:
        await summarize(request(upstream), "", span())
    assert failed.value.rejected == ("echo", "too_short")
    assert len(upstream.summary_calls) == 2  # retried once, not more


async def test_the_simple_retry_counts_against_max_summary_calls() -> None:
    """Two calls allowed: a cut-off answer and its terser retry use both; the echo that
    came back is not asked for a third time."""
    upstream = FakeUpstream()
    upstream.script(
        summaries=[summary_reply(GOOD, finish_reason="length"), summary_reply(CORE.system)]
    )
    with pytest.raises(SummaryRejected) as failed:
        await summarize(request(upstream, max_calls=2), "", span())
    assert failed.value.rejected == ("truncated", "echo")
    assert len(upstream.summary_calls) == 2


async def test_a_simple_retry_cut_off_is_a_failure_counted_as_truncated() -> None:
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(""), summary_reply(GOOD, finish_reason="length")])
    with pytest.raises(SummaryRejected) as failed:
        await summarize(request(upstream), "", span())
    assert failed.value.rejected == ("empty", "truncated")


async def test_cut_off_twice_still_raises_truncated_with_its_reasons() -> None:
    upstream = FakeUpstream()
    cut = summary_reply(GOOD, finish_reason="length")
    upstream.script(summaries=[cut, cut])
    with pytest.raises(SummaryTruncated) as failed:
        await summarize(request(upstream), "", span())
    assert failed.value.rejected == ("truncated", "truncated")


# --- end to end: the real proxy, a simulator playing a weak summarizer ----------------------


async def test_an_answer_holding_the_calls_marker_is_an_echo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real 0.5B run (bench/README.md, real models): "The user wants to summarize the
    conversation between tags that carry a marker 05563640" under three headings passed
    every other check and was stored. The marker is in no quoted text: it was copied."""
    monkeypatch.setattr("proxy.core.transcript.secrets.token_hex", lambda _: "05563640")
    copied = GOOD.replace(
        "Answer the questions", "Summarize the tags that carry a marker 05563640 and answer"
    )
    assert check_summary(copied, CORE, 400, SPAN_CHARS) is None  # the other checks pass it
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(copied), summary_reply(GOOD)])
    made = await summarize(request(upstream), "", span())
    assert (made.text, made.rejected) == (GOOD, ("echo",))
    assert systems(upstream) == [CORE.system, SIMPLE.system]
    upstream = FakeUpstream()
    upstream.script(summaries=[summary_reply(copied), summary_reply(copied)])
    with pytest.raises(SummaryRejected) as failed:
        await summarize(request(upstream), "", span())
    assert failed.value.rejected == ("echo", "echo")
