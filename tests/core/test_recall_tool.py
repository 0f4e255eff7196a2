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
)
from proxy.core.tokens import TokenCounter
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
