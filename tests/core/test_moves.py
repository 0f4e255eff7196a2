"""moves.py and what uses it: a client that moves the messages it re-sends keeps its
snapshot (snapshot.py's ``loaded_for``), and cuts stop before what it re-sends
(plan.py's ``settled``). Histories are written out by hand, as aider sends them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.compaction.snapshots import load_session
from proxy.core.budget import Budget
from proxy.core.digest import digests_and_sizes, prefix_hash
from proxy.core.history import History, result_flags
from proxy.core.moves import SEEN_LIMIT, moved, seen_record
from proxy.core.plan import plan_compaction
from proxy.core.session import session_from_header
from proxy.core.snapshot import Snapshot, body_hash, loaded_for, side_of, valid_snapshot
from proxy.core.view import View
from proxy.store.memory import MemoryStore
from proxy.types import ChatMessage

FILES: list[ChatMessage] = [
    {"role": "user", "content": "Here are the files: app.py ..."},
    {"role": "assistant", "content": "Ok."},
]


def said(n: int, first: int = 0) -> list[ChatMessage]:
    """``n`` messages of conversation, user and assistant in turn, numbered from ``first``."""
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"turn {i}"} for i in range(first, first + n)]


def aider(done: int, newest: int | None = None) -> list[ChatMessage]:
    """A system prompt, ``done`` messages, the files exchange, then the newest message."""
    last: ChatMessage = {"role": "user", "content": f"newest {newest or done}"}
    return [{"role": "system", "content": "Act as a developer."}, *said(done), *FILES, last]


def history(messages: list[ChatMessage], count: int = 10) -> History:
    digests, _ = digests_and_sizes(messages)
    return History(messages, digests, [count] * len(messages), 1, 0, result_flags(messages))


def snapshot_on(h: History, covered: int) -> Snapshot:
    """What a summary of ``h`` up to ``covered`` stores."""
    return Snapshot(
        version=2,
        summary="S",
        pinned=h.pinned,
        covered=covered,
        elide_before=covered,
        anchor_hash=prefix_hash(h.digests, covered),
        summary_tokens=40,
        tokens_before=900,
        tokens_after=400,
        created_at=1.0,
        updated_at=2.0,
        seen=seen_record(h.digests, covered, h.pinned),
    )


def test_a_history_that_only_grows_moves_nothing() -> None:
    h = history(aider(6))
    grown = history([*h.messages, {"role": "assistant", "content": "done"}])
    assert moved(seen_record(h.digests, 4, 1), grown.digests, 4) is None


def test_the_files_exchange_moved_on_is_found_where_it_went() -> None:
    before = history(aider(6))  # files at 7 and 8, newest at 9
    after = history(aider(8))  # files at 9 and 10: two messages said before them
    move = moved(seen_record(before.digests, 9, 1), after.digests, 9)
    assert move is not None
    assert (move.gone, move.settled, move.kept) == (7, 9, True)


def regenerated(answer: str) -> list[ChatMessage]:
    """The files exchange, a question, ``answer``, and the next question."""
    asked: list[ChatMessage] = [{"role": "user", "content": "why?"}]
    answered: list[ChatMessage] = [{"role": "assistant", "content": answer}]
    return [*aider(6)[:-1], *asked, *answered, {"role": "user", "content": f"and {answer}"}]


def test_an_answer_regenerated_is_no_move() -> None:
    before, after = history(regenerated("because")), history(regenerated("since"))
    move = moved(seen_record(before.digests, 11, 1), after.digests, 11)
    assert move is not None
    assert move.settled is None
    assert not move.kept  # the answer covered is nowhere further on


def test_an_edit_before_what_was_remembered_is_no_move() -> None:
    before = history(aider(30))  # remembered from 22 (anchor 30, less eight) on
    edited = aider(32)
    edited[3] = {"role": "assistant", "content": "edited"}
    assert moved(seen_record(before.digests, 30, 1), history(edited).digests, 30) is None


def test_at_most_the_newest_positions_are_remembered() -> None:
    h = history(aider(200))
    start, _, shorts = seen_record(h.digests, 60, 1).split(":")
    assert int(start) == len(h.messages) - SEEN_LIMIT
    assert len(shorts) == SEEN_LIMIT * 16


@pytest.mark.parametrize(
    "stored",
    ["", ":", "7", "7:", "x:" + "0" * 32 + ":" + "ab" * 8, "1:" + "0" * 32 + ":abc",
     "1:" + "0" * 32 + ":" + "zz" * 8, "1:" + "0" * 32 + ":" + "ab" * 8 * (SEEN_LIMIT + 1),
     "1:short:" + "ab" * 8, "99999999999999999999:" + "0" * 32 + ":" + "ab" * 8],
)  # fmt: skip
def test_a_stored_record_it_did_not_write_moves_nothing(stored: str) -> None:
    assert moved(stored, history(aider(6)).digests, 4) is None


def test_a_snapshot_whose_cut_took_the_moved_exchange_applies_up_to_it() -> None:
    before = history(aider(6))
    snapshot = snapshot_on(before, 9)  # a summary of all but the newest: files included
    after = history(aider(8))
    loaded = loaded_for(snapshot, after)
    assert loaded.stored is snapshot
    assert loaded.valid is not None
    assert (loaded.valid.covered, loaded.valid.elide_before) == (7, 7)
    assert loaded.valid.anchor_hash == prefix_hash(after.digests, 7)
    assert loaded.summary == "S"
    assert loaded.settled == 9


def test_a_snapshot_whose_covered_answer_was_regenerated_does_not_apply() -> None:
    snapshot = snapshot_on(history(regenerated("because")), 11)  # covers the answer
    assert loaded_for(snapshot, history(regenerated("since"))).valid is None


def files_budget(window: int, trigger: int) -> Budget:
    """A target of 400, a summary of 50, the newest message the whole protected tail,
    and no elision (every message is 100 tokens, none bulky)."""
    return Budget(
        window=window, reserve=0, fixed=0, trigger=trigger, target=400, summary_allowance=50,
        min_tail_messages=1, elide_min_tokens=10_000,
    )  # fmt: skip


def test_a_cut_stops_before_the_re_sent_exchange() -> None:
    # 16 messages of 100 tokens: files at 13 and 14. To reach the target of 400 with a
    # summary of 50 and the system prompt, two messages stay (a cut at 14, "Ok." and
    # the newest); held before the files, three stay: 450 tokens, past the target,
    # well within the window.
    h = history(aider(12, newest=99), count=100)
    budget = files_budget(window=2000, trigger=1200)
    current = View(1, 0, 1)
    free = plan_compaction(h, current, budget)
    held = plan_compaction(h, current, budget, settled=13)
    assert free.view.covered == 14  # the files' message folded in
    assert (held.view.covered, held.summarize, held.tokens) == (13, (1, 13), 450)
    assert held.view.elide_before <= 13
    assert held.fits


def test_a_cut_passes_the_re_sent_exchange_when_only_that_fits() -> None:
    h = history(aider(12, newest=99), count=100)
    held = plan_compaction(h, View(1, 0, 1), files_budget(window=400, trigger=300), settled=13)
    assert (held.view.covered, held.tokens) == (14, 350)  # 450 held back: over the window
    assert held.fits


# --- side requests: another system prompt over the same conversation --------------------


def side_request(h: History, *pinned: str) -> History:
    """``h``'s conversation after its system prompt, under ``pinned`` system messages,
    with the side request's own instruction last."""
    lead: list[ChatMessage] = [{"role": "system", "content": p} for p in pinned]
    ask: ChatMessage = {"role": "user", "content": "Extract the facts worth remembering."}
    messages = [*lead, *h.messages[1:], ask]
    digests, _ = digests_and_sizes(messages)
    return History(messages, digests, [10] * len(messages), len(lead), 0, result_flags(messages))


def with_body(snapshot: Snapshot, h: History) -> Snapshot:
    return replace(snapshot, body_hash=body_hash(h.digests, h.pinned, snapshot.anchor))


@pytest.mark.parametrize("pinned", [("You extract memories.",), ("Titles.", "Be brief.")])
def test_a_side_request_is_shown_under_its_conversations_snapshot(pinned: tuple[str]) -> None:
    main = history(said(12))
    snapshot = with_body(snapshot_on(main, 9), main)
    side = side_request(main, *pinned)
    assert valid_snapshot(snapshot, side) is None  # its own pinned messages differ
    shown = side_of(snapshot, side)
    assert shown is not None
    shift = len(pinned) - 1
    assert (shown.pinned, shown.covered, shown.elide_before) == (len(pinned), 9 + shift, 9 + shift)
    assert valid_snapshot(shown, side) is shown  # anchored to the side request's history
    assert shown.summary == snapshot.summary


def test_a_request_over_another_conversation_is_no_side_request() -> None:
    main = history(said(12))
    snapshot = with_body(snapshot_on(main, 9), main)
    edited = history([main.messages[0], {"role": "user", "content": "other"}, *said(11, 1)])
    assert side_of(snapshot, side_request(edited, "You extract memories.")) is None
    short = history(said(6))  # ends before what the snapshot covers
    assert side_of(snapshot, side_request(short, "You extract memories.")) is None
    assert side_of(snapshot_on(main, 9), side_request(main, "x")) is None  # no body hash


async def test_a_side_request_reads_its_conversations_slot_and_would_write_its_own() -> None:
    store, key = MemoryStore(ttl_s=60), session_from_header("t", "agent")
    main = history(said(12))
    assert await store.save(key, replace(with_body(snapshot_on(main, 9), main), version=1))
    misses: list[str] = []
    side = side_request(main, "You extract memories.")
    at, loaded = await load_session(store, key, side, 4, misses.append)
    assert at != key  # a compaction of its own would not replace the conversation's
    assert (loaded.stored, loaded.side, misses) == (None, True, ["side"])
    assert loaded.summary == "S"
    assert loaded.shown_version == 1
    again, mine = await load_session(store, key, main, 4)
    assert (again, mine.side, mine.valid is not None) == (key, False, True)
