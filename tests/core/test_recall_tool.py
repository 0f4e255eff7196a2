"""The recall tool's pure parts: what its definition costs, how a call's query reads."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.recall_tool import (
    MAX_QUERY_CHARS,
    NOTHING_FOUND,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_PARAMETERS,
    TOOL_TOKENS,
    query_of,
    tool_result,
    view_summary,
)
from proxy.core.tokens import TokenCounter
from proxy.core.wording import handoff_text
from proxy.types import ChatRequest
from tests.support.chat import TOOLS
from tests.support.encoders import ENCODER


@pytest.mark.parametrize("templated", [False, True])
def test_the_definition_costs_no_more_than_its_bound(templated: bool) -> None:
    """Counted as the view's tools are (as JSON, and as an open model's template), the
    one tool costs at most ``TOOL_TOKENS`` more than the client's tools alone (it is
    offered only to a request that carries tools)."""
    counter = TokenCounter(ENCODER)
    tool = {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": TOOL_PARAMETERS,
        },
    }
    bare = ChatRequest(model="m", messages=[], tools=TOOLS)
    tooled = ChatRequest(model="m", messages=[], tools=[*TOOLS, tool])
    added = counter.fixed(tooled, templated=templated) - counter.fixed(bare, templated=templated)
    assert added <= TOOL_TOKENS


@pytest.mark.parametrize(
    ("arguments", "query"),
    [
        ('{"query": "vault_code"}', "vault_code"),
        ('{"q": "x"}', '{"q": "x"}'),  # loosely written: its own text
        ("vault code", "vault code"),  # not JSON at all
        (orjson.dumps({"query": "a" * 5000}).decode(), "a" * MAX_QUERY_CHARS),
    ],
)
def test_a_calls_query_is_its_query_string_bounded(arguments: str, query: str) -> None:
    assert query_of(arguments) == query


def test_nothing_found_says_so() -> None:
    assert tool_result([]) == NOTHING_FOUND


SUMMARY = """## Goal
Ship the billing export.

## Decisions
- The queue is the managed one, not the self-hosted broker.
- Exports run nightly.

## Open questions
- Who signs off?"""


def test_a_section_opened_is_searched_by_its_own_words() -> None:
    """Its sources share its words: the section's lines are the query, the others not."""
    query = query_of('{"section": "decisions"}', SUMMARY)
    assert "managed one" in query
    assert "nightly" in query
    assert "billing export" not in query
    assert "signs off" not in query
    # a heading written with its hashes, or only its start, opens the same section
    assert query_of('{"section": "## Decisions"}', SUMMARY) == query
    assert "signs off" in query_of('{"section": "Open"}', SUMMARY)


def test_a_section_and_a_query_are_both_searched_and_an_unknown_one_is_its_words() -> None:
    both = query_of('{"query": "vault_code", "section": "Goal"}', SUMMARY)
    assert both.startswith("vault_code")
    assert "billing export" in both
    assert query_of('{"section": "Risks"}', SUMMARY) == "Risks"
    assert query_of('{"section": "Goal"}', "") == "Goal"  # no summary in the view
    long = orjson.dumps({"section": "Decisions", "query": "q" * 5000}).decode()
    assert len(query_of(long, SUMMARY)) == MAX_QUERY_CHARS


def test_the_views_summary_is_read_from_its_handoff() -> None:
    handoff = {"role": "user", "content": handoff_text(SUMMARY)}
    assert view_summary([{"role": "system", "content": "s"}, handoff]) == SUMMARY
    assert view_summary([{"role": "user", "content": "no handoff"}]) == ""
    assert view_summary(None) == ""
