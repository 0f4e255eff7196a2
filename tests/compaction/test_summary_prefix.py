"""The summary asked as the turn's own request (``compaction.summary_prompt: cached``,
proxy/compaction/summary_prefix.py) in-process: what the fake upstream receives, and
where the summary falls back to a transcript."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxy.compaction.summary_request import SummaryRequest
from proxy.core.outcome import Turn
from proxy.pipeline import compacted_view
from proxy.routes.chat import CHAT
from proxy.services import Services
from proxy.types import ChatMessage
from tests.support.fakes import (
    FILLER,
    FakeClock,
    FakeUpstream,
    conversation,
    fake_settings,
    make_services,
    turn_of,
)

STOP = "Stop the conversation here"
# Just past the trigger of the 4k window: the span's prefix fits the window with the answer.
TURNS = 16


async def _chat_turn(services: Services, messages: list[ChatMessage], **data: Any) -> Turn:
    """A chat completions request for ``messages``, its API and object known."""
    turn = await turn_of(services, messages)
    chat: Any = {**turn.chat, **data}
    return replace(turn, chat=chat, api=CHAT, data=chat)


async def test_the_summary_is_the_turn_s_own_request_with_the_instruction_last() -> None:
    upstream, clock = FakeUpstream(), FakeClock()
    services = make_services(fake_settings(), upstream, clock)
    messages = conversation(TURNS)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    turn = await _chat_turn(services, messages, tools=tools, tool_choice="auto")
    outcome, _ = await compacted_view(services, turn)
    assert outcome.status == "compacted"
    (call,) = upstream.summary_calls
    assert call.url == "http://upstream.invalid/v1/chat/completions"
    asked = call.messages
    assert asked[:-1] == messages[: len(asked) - 1]  # the history as sent, to the cut
    assert asked[-1]["role"] == "user"
    assert asked[-1]["content"].startswith(STOP)
    # What caches with the messages stays; what shapes only the answer is the summary's.
    assert call.body["tools"] == tools
    assert call.body["tool_choice"] == "auto"
    assert call.body["stream"] is False
    assert call.body["max_tokens"] == 400


async def test_a_later_summary_reads_the_view_the_last_turn_sent() -> None:
    """The second compaction's prefix is the first's view (pinned, handoff, tail) as the
    upstream received it on the turn before: what its cache holds."""
    upstream, clock = FakeUpstream(), FakeClock()
    services = make_services(fake_settings(), upstream, clock)
    messages = conversation(TURNS)
    sent: list[dict[str, Any]] = []
    for t in range(60):  # bounded: the second compaction comes within a few dozen turns
        outcome, _ = await compacted_view(services, await _chat_turn(services, messages))
        if len(upstream.summary_calls) == 2:
            break
        sent = [dict(m) for m in (outcome.messages or messages)]
        messages = [
            *messages,
            {"role": "assistant", "content": f"Noted {t}. {FILLER}"},
            {"role": "user", "content": f"Next {t}: {FILLER}"},
        ]
    second = upstream.summary_calls[1].messages
    assert any("summary" in str(m.get("content")).lower() for m in second[1:3])  # the handoff
    assert second[:-1] == sent[: len(second) - 1]
    assert second[-1]["content"].startswith(STOP)


@pytest.mark.parametrize(
    ("compaction", "data"),
    [
        ({"summary_prompt": "transcript"}, {}),
        ({"summarizer_model": "other-model"}, {}),  # another model's cache is not the turn's
        ({"summarizer_context_window": 1500}, {}),  # the prefix does not fit the summarizer
        ({}, {"tool_choice": "required"}),  # a forced tool call would answer instead
    ],
    ids=["asked-for", "other-model", "too-small", "forced-tool"],
)
async def test_otherwise_the_summarizer_gets_a_transcript(
    compaction: dict[str, Any], data: dict[str, Any]
) -> None:
    upstream, clock = FakeUpstream(), FakeClock()
    settings = fake_settings(**compaction)
    services = make_services(settings, upstream, clock)
    outcome, _ = await compacted_view(
        services, await _chat_turn(services, conversation(TURNS), **data)
    )
    assert outcome.status == "compacted"
    call = upstream.summary_calls[0]
    assert call.messages[0]["role"] == "system"  # the proxy's own instructions
    assert "marker" in call.messages[-1]["content"]  # a framed transcript
    assert STOP not in call.messages[-1]["content"]


async def test_a_turn_of_unknown_api_is_summarized_from_a_transcript() -> None:
    upstream, clock = FakeUpstream(), FakeClock()
    services = make_services(fake_settings(), upstream, clock)
    turn = await turn_of(services, conversation(TURNS))  # no api, no request object
    request = SummaryRequest.for_turn(
        turn, services.settings, services.models, upstream, services.counters
    )
    assert request.cached is None
    await compacted_view(services, turn)
    assert STOP not in upstream.summary_calls[0].messages[-1]["content"]
