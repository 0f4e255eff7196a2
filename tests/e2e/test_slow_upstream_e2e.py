"""A slow, single-slot upstream (llama.cpp ``-np 1`` on a loaded CPU): no turn waits on a
summary longer than ``compaction.summary_deadline_s``, a turn that queued behind the
proxy's own summary says so, and summaries the model cannot finish in time stop.

End to end: the real proxy under uvicorn, the OpenAI SDK as the client (tests/support/
chat.py), the project's simulator as the upstream with one slot and a generation speed
(``tokens_per_s``) at which its summary takes four times the turn's deadline.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.config import ModelSpec
from proxy.simulator import create_simulator_app
from proxy.simulator.config import Listing, ModelRule, SimulatorConfig
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.metrics import metric
from tests.support.servers import run_server
from tests.support.timing import slack_s

pytestmark = pytest.mark.e2e

DEADLINE_S = 1.0
# The simulator's summary of these conversations is about 50 tokens: at 12 tokens a
# second it takes over 4 s, four times the deadline; a turn's 2-token reply takes 0.17 s.
SPEED = 12.0
TURNS = 60
SOFT = 0.6  # the soft threshold, where a background summary starts


def _simulator(slots: int | None, listing: Listing = "vllm") -> SimulatorConfig:
    return SimulatorConfig(
        slots=slots,
        tokens_per_s=SPEED,
        reply_tokens=2,
        models=(ModelRule(match="sim-4k", context_window=WINDOW),),
        listing=listing,
    )


@pytest.fixture(scope="module")
def single_slot() -> Iterator[str]:
    with run_server(create_simulator_app(_simulator(slots=1))) as url:
        yield url


@pytest.fixture(scope="module")
def llamacpp_one_slot() -> Iterator[str]:
    """One slot, and llama.cpp's ``/props`` saying so (``total_slots``: 1)."""
    with run_server(create_simulator_app(_simulator(slots=1, listing="llamacpp"))) as url:
        yield url


@pytest.fixture(scope="module")
def many_slots() -> Iterator[str]:
    with run_server(create_simulator_app(_simulator(slots=None))) as url:
        yield url


def _settings(sim: str, *, precompact: bool, slots: int | None = None, **compaction: Any) -> Any:
    settings = small_window_settings(
        sim, summary_deadline_s=DEADLINE_S, summary_timeout_s=30, **compaction
    )
    model = ModelSpec(
        match="sim-4k",
        context_window=WINDOW,
        max_output_tokens=256,
        precompact=precompact,
        slots=slots,
    )
    return settings.model_copy(update={"models": [model]})


def _said_settings(sim: str, **compaction: Any) -> Any:
    """No ``models:`` entry: the window and the one slot as the server's ``/props`` says."""
    settings = _settings(sim, precompact=True, **compaction)
    default = settings.default_model.model_copy(update={"max_output_tokens": 256})
    return settings.model_copy(update={"models": [], "default_model": default})


FACT = "Ticket triage gave us an identifier for it - FACT ticket_9=val911q1 - keep it handy."


def _turn(chat: Chat, number: int) -> float:
    started = time.monotonic()
    chat.say(f"Turn {number}: {FILLER * 3}" + (f" {FACT}" if number == 1 else ""))
    return time.monotonic() - started


def _play(chat: Chat, turns: int) -> tuple[list[float], list[str | None]]:
    """``turns`` turns back to back: each one's seconds, and its X-Compaction-Degraded."""
    took, degraded = [], []
    for number in range(turns):
        took.append(_turn(chat, number))
        assert chat.last is not None
        degraded.append(chat.last.get("x-compaction-degraded"))
    return took, degraded


def _bound(url: str, took: list[float]) -> float:
    """The longest a turn may take: the deadline plus an ordinary turn (the median of the
    first five, before the trigger: a turn and nothing else), with the machine's slack."""
    return DEADLINE_S + statistics.median(took[:5]) + slack_s(url, 0.5)


def test_no_turn_waits_past_the_deadline_on_a_summary_it_cannot_finish(
    single_slot: str, start_proxy: Callable[..., str]
) -> None:
    """One slot (its model declared ``precompact: false``, as the README advises for one),
    a summary four times the deadline: 60 turns through compaction, none waits longer than
    the deadline plus one ordinary turn, each that waited says so; each summary dropped
    teaches the model's speed, so the next asks for at most half as many tokens (pace.py),
    and once not even the shortest summary could finish in time it stops asking (counted).
    A short back-off, so the session asks again within the test."""
    url = start_proxy(_settings(single_slot, precompact=False, summary_backoff_s=0.5))
    chat = Chat(url, session="slow-one-slot")
    before = stats(single_slot)
    took, degraded = _play(chat, TURNS)
    bound = _bound(url, took)
    assert max(took) <= bound, (took, bound)  # without the deadline: 4 s and more
    assert chat.statuses["trimmed"] >= TURNS // 2  # through compaction, served trimmed
    # Each turn that waited on a summary says so; no other queued for the slot (those may,
    # for the moment a dropped summary's slot takes to be freed).
    waited = [n for n, why in enumerate(degraded) if why == "summary_deadline"]
    assert all(took[n] >= DEADLINE_S for n in waited)
    after = stats(single_slot)
    asked = after["summaries"] - before["summaries"]
    assert asked == len(waited)
    assert after["slot_waits"] - before["slot_waits"] <= asked
    # 400 tokens, then at most 200 (the shortest asked for is 128): two, three at most.
    assert 2 <= asked <= 3, degraded
    # It cannot finish in time: not asked again; each turn it skipped counted.
    skipped = metric(url, "compaction_proxy_compactions", outcome="too_slow")
    assert skipped >= 1
    assert degraded.count("summary_slow") == skipped
    assert max(waited) < degraded.index("summary_slow")
    assert metric(url, "compaction_proxy_degraded_requests", reason="summary_deadline") == asked
    # Served trimmed, yet what the trim dropped comes back by recall (recall.py).
    answer = chat.say("Quick question about the ticket we noted, ticket_9: RECALL ticket_9")
    assert answer == "ticket_9=val911q1"
    assert chat.last is not None
    assert int(chat.last.get("x-compaction-recalled", "0")) >= 1


def test_a_summary_past_the_deadline_finishes_in_the_background(
    many_slots: str, start_proxy: Callable[..., str]
) -> None:
    """An upstream with slots to spare: the turn is served at its deadline without the
    summary, which goes on in the background and is applied to a later turn."""
    url = start_proxy(_settings(many_slots, precompact=True))
    chat = Chat(url, session="slow-many-slots")
    number, took = 0, []
    while chat.last is None or chat.last.get("x-compaction-degraded") != "summary_deadline":
        took.append(_turn(chat, number))
        number += 1
        assert number < 30, "no turn reached its deadline"
    ordinary = statistics.median(took[:5])
    assert took[-1] <= DEADLINE_S + ordinary + slack_s(url, 0.5), took
    deadline = time.monotonic() + 30
    while _version(url, "slow-many-slots") == 0:
        assert time.monotonic() < deadline, "the summary never landed"
        time.sleep(0.1)
    _turn(chat, number)
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "snapshot"
    assert int(chat.last["x-compaction-version"]) >= 1
    assert metric(url, "compaction_proxy_compactions", outcome="compacted") >= 1


def _version(url: str, session: str) -> int:
    """The session's snapshot version (GET /sessions/{id}); 0: none yet."""
    answer = httpx.get(f"{url}/sessions/{session}", headers={"Authorization": "Bearer sk-tenant-a"})
    return int(answer.json().get("version", 0)) if answer.status_code == 200 else 0


def test_a_turn_queued_behind_a_background_summary_says_so(
    single_slot: str, start_proxy: Callable[..., str]
) -> None:
    """The proxy's defaults on one slot: past the soft threshold a background summary
    takes the slot, and the turn sent meanwhile queues behind it upstream; it carries
    ``X-Compaction-Degraded: summary_busy`` and is counted."""
    url = start_proxy(_settings(single_slot, precompact=True, precompact_ratio=SOFT))
    chat = Chat(url, session="slow-busy")
    summaries, number = stats(single_slot)["summaries"], 0
    while int(chat.last["x-context-tokens"] if chat.last else 0) + 256 <= WINDOW * SOFT:
        _turn(chat, number)
        number += 1
        assert number < 30
    deadline = time.monotonic() + 30
    while stats(single_slot)["summaries"] == summaries or not metric(
        url, "compaction_proxy_precompactions_running"
    ):
        assert time.monotonic() < deadline, "no background summary started"
        time.sleep(0.05)  # until the background summary holds the slot
    waits = stats(single_slot)["slot_waits"]
    _turn(chat, number)
    assert chat.last is not None
    assert stats(single_slot)["slot_waits"] > waits  # it did queue, upstream
    assert chat.last.get("x-compaction-degraded") == "summary_busy"
    assert metric(url, "compaction_proxy_degraded_requests", reason="summary_busy") >= 1


@pytest.mark.parametrize("known", ["declared", "said", "said-to-an-entry"])
def test_a_background_summary_gives_way_to_a_turn_on_a_single_slot_server(
    known: str, request: pytest.FixtureRequest, start_proxy: Callable[..., str]
) -> None:
    """The proxy's defaults (background summaries on) on one slot, the slot known: declared
    (``slots: 1``) or said by llama.cpp's ``/props``, for a model no entry names or for
    one an entry names without ``slots``. 60 turns sent back to back through
    compaction: each background summary is cancelled by the turn that follows it (counted
    ``yielded``, cancelled upstream), so no turn waits behind one; the inline ones are
    bounded by the deadline as on a ``precompact: false`` model, and once they cannot
    finish in time they stop. Without the yield, a turn waits the whole 4 s summary.
    ``precompact_idle_s: 0``: the summaries reach the upstream before they give way."""
    sim = request.getfixturevalue("single_slot" if known == "declared" else "llamacpp_one_slot")
    # No wait before the call: each summary reaches the upstream, and is cancelled there.
    extra = {"precompact_ratio": SOFT, "summary_backoff_s": 0.5, "precompact_idle_s": 0}
    if known == "declared":
        url = start_proxy(_settings(sim, precompact=True, slots=1, **extra))
    else:
        said = _said_settings(sim, **extra)
        if known == "said-to-an-entry":
            said = _settings(sim, precompact=True, **extra)
        url = start_proxy(said)
        _turn(Chat(url, session="first-ask"), 0)  # the first request asks /props
        deadline = time.monotonic() + 10
        while not metric(url, "compaction_proxy_model_discoveries", outcome="described"):
            assert time.monotonic() < deadline, "the upstream was never described"
            time.sleep(0.05)
    chat = Chat(url, session=f"gives-way-{known}")
    before = stats(sim)
    took, degraded = _play(chat, TURNS)
    bound = _bound(url, took)
    assert max(took) <= bound, (took, bound)
    yielded = metric(url, "compaction_proxy_precompactions", outcome="yielded")
    assert yielded >= 1  # a background summary did start, and gave way
    after = stats(sim)
    assert after["calls_abandoned"] - before["calls_abandoned"] >= 1  # stopped upstream
    assert "summary_busy" not in degraded  # no turn sent behind a summary of its own
    assert metric(url, "compaction_proxy_precompactions", outcome="compacted") == 0
    assert "summary_slow" in degraded  # and the inline ones stopped, as without a slot


def test_a_turn_right_after_its_answer_cancels_the_summary_before_it_is_sent(
    single_slot: str, start_proxy: Callable[..., str]
) -> None:
    """``precompact_idle_s`` (5 s here, 2 s by default, so a loaded machine's gap between
    an answer and the next turn stays well inside it) on one slot, turns sent back to
    back: each background summary gives way while it waits for the model, so none reaches
    the upstream (none cancelled there, no slot or prompt cache taken from a turn); the
    summaries the upstream sees are the inline ones alone, each a turn past its deadline."""
    settings = _settings(
        single_slot, precompact=True, slots=1, precompact_ratio=SOFT, precompact_idle_s=5
    )
    url = start_proxy(settings)
    chat = Chat(url, session="gives-way-idle")
    before = stats(single_slot)
    _, degraded = _play(chat, TURNS // 2)
    after = stats(single_slot)
    assert metric(url, "compaction_proxy_precompactions", outcome="yielded") >= 1
    assert after["calls_abandoned"] - before["calls_abandoned"] == degraded.count(
        "summary_deadline"
    )  # only the inline summaries dropped at the deadline were cancelled upstream
    assert after["summaries"] - before["summaries"] == degraded.count("summary_deadline")
