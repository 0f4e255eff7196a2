"""Nothing the client sent is lost: with a summarizer that keeps nothing, the facts of a
long conversation come back from the archive of originals as verbatim excerpts, placed
before the newest user message, and the prefix the provider caches stays byte-stable.

The simulator's summarizer here forgets every fact (``summary_forgets: 1``); facts are
stated in varied sentences, each with a ``FACT key=value`` a reader of the excerpt's
verbatim text (the simulator's RECALL rule) answers from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from proxy.core.excerpts import EXCERPTS_ACKNOWLEDGEMENT
from proxy.core.wording import HANDOFF_INTRO
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, Chat, chat_requests, small_window_settings
from tests.support.metrics import exact_metric, metric
from tests.support.servers import run_server

TURNS = 200
QUESTIONS = 30
# Varied sentences around each fact: a person, a date, an amount, a path, an id, a setting.
PHRASINGS = (
    "By the way, the person who signs off on this is someone to remember: FACT {k}={v} is who.",
    "We agreed on a date in the planning call yesterday, write it down: FACT {k}={v}",
    "Finance confirmed the figure after some back and forth; FACT {k}={v} is final.",
    "The file we keep coming back to lives where I said before, FACT {k}={v} on the share.",
    "Ticket triage gave us an identifier for it - FACT {k}={v} - keep it handy.",
    "One setting matters for the rollout, the others do not: FACT {k}={v}",
)
TOPICS = ("approver", "launch", "budget", "config", "ticket", "timeout")


@pytest.fixture
def forgetful_sim() -> Iterator[str]:
    """A 4k model whose summaries carry no fact at all."""
    rule = ModelRule(match="sim-4k", summary_style="ideal", summary_forgets=1)
    with run_server(create_simulator_app(SimulatorConfig(models=(rule,)))) as url:
        yield url


def facts_for(turns: int) -> dict[int, tuple[str, str]]:
    """120 facts over 200 turns (three turns in five), keys and values all distinct."""
    facts = {}
    for turn in range(turns):
        if turn % 5 in (0, 1, 3):
            n = len(facts)
            facts[turn] = (f"{TOPICS[n % 6]}_{n}", f"val{n * 37 + 11}q{turn}")
    return facts


def play(chat: Chat, facts: dict[int, tuple[str, str]]) -> None:
    for turn in range(TURNS):
        said = f"Turn {turn}: {FILLER}"
        if turn in facts:
            k, v = facts[turn]
            said += " " + PHRASINGS[turn % len(PHRASINGS)].format(k=k, v=v)
        chat.say(said)


def ask(chat: Chat, facts: dict[int, tuple[str, str]]) -> tuple[int, int, list[int]]:
    """30 questions about facts stated at least 40 turns before them: how many answered
    right, how many with another fact's value, and each answer's X-Compaction-Recalled."""
    old = [t for t in facts if t <= TURNS - 40]
    asked = old[:: len(old) // QUESTIONS][:QUESTIONS]
    values = {v for _, v in facts.values()}
    right = wrong = 0
    recalled = []
    for turn in asked:
        k, v = facts[turn]
        topic = k.split("_")[0]
        answer = chat.say(f"Quick question about the {topic} we noted, {k}: RECALL {k}")
        assert chat.last is not None
        recalled.append(int(chat.last.get("x-compaction-recalled", "-1")))
        if answer == f"{k}={v}":
            right += 1
        elif answer.partition("=")[2] in values:
            wrong += 1
    return right, wrong, recalled


def settings(sim: str, recall: bool) -> Any:
    return small_window_settings(sim, recall=recall, summary_max_tokens=600)


def test_facts_a_summary_dropped_come_back_as_excerpts(
    forgetful_sim: str, start_proxy: Any
) -> None:
    """≥ 27/30 answered right and ≤ 2 with another fact's value, after 200 turns."""
    url = start_proxy(settings(forgetful_sim, recall=True))
    chat = Chat(url, session="recall-on")
    facts = facts_for(TURNS)
    assert len(facts) == 120
    play(chat, facts)
    assert chat.statuses["compacted"] >= 5
    right, wrong, recalled = ask(chat, facts)
    assert right >= 27, (right, recalled)
    assert wrong <= 2
    assert min(recalled) >= 0  # every question's view was searched
    assert exact_metric(url, "compaction_proxy_recalled_excerpts_total") >= right
    assert metric(url, "compaction_proxy_archive_writes_total", outcome="archived") >= 5
    _assert_prefix_stable(chat_requests(forgetful_sim))


def test_without_recall_the_same_conversation_loses_the_facts(
    forgetful_sim: str, start_proxy: Any
) -> None:
    """The control: the same turns with recall off answer few (what recall adds)."""
    url = start_proxy(settings(forgetful_sim, recall=False))
    chat = Chat(url, session="recall-off")
    facts = facts_for(TURNS)
    play(chat, facts)
    right, _, recalled = ask(chat, facts)
    assert right < 27
    assert set(recalled) == {-1}  # no header: recall did not look


def _assert_prefix_stable(requests: list[dict[str, Any]]) -> None:
    """Between two compactions, each request is the one before it less its excerpts,
    plus the new turns: the pinned messages, the summary and the verbatim tail are
    byte-identical, and excerpts only ever stand right before the newest user message."""
    compared = with_excerpts = 0
    previous: list[bytes] | None = None
    previous_handoff: bytes | None = None
    for request in requests:
        messages = request["body"]["messages"]
        encoded = [orjson.dumps(m) for m in messages]
        handoff = next((e for m, e in zip(messages, encoded, strict=True) if _is_handoff(m)), None)
        acks = [i for i, m in enumerate(messages) if m.get("content") == EXCERPTS_ACKNOWLEDGEMENT]
        assert len(acks) <= 1
        if acks:
            (i,) = acks
            with_excerpts += 1
            assert messages[i - 1]["role"] == "user"
            assert i + 2 == len(messages)  # the newest user message follows
            assert messages[-1]["role"] == "user"
            assert handoff is not None
            assert encoded.index(handoff) < i - 1  # after the summary
            stripped = encoded[: i - 1] + encoded[i + 1 :]
        else:
            stripped = encoded
        if previous is not None and handoff is not None and handoff == previous_handoff:
            assert stripped[: len(previous)] == previous
            compared += 1
        previous, previous_handoff = stripped[:-1], handoff  # its newest turn ends it
    assert compared >= 20
    assert with_excerpts >= 27


def _is_handoff(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(HANDOFF_INTRO)
