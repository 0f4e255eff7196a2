"""A session's snapshot, and what of it one history may use.

A snapshot applies only while the incoming history still starts with exactly
the messages it covers (DESIGN invariant 2): edited, rewound or branched
histories are planned from scratch. Two differences are not changes: messages the
client moved further on, each found again (``loaded_for``, moves.py), and other pinned
messages before the same conversation, a side request (``side_of``). The stored
snapshot is still what a new one replaces, so its version (and bookkeeping) travel
beside the part of it this history may use (``Loaded``). Loading and saving are
compaction/snapshots.py's and the store's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from proxy.core.digest import anchor_matches, prefix_hash
from proxy.core.history import History
from proxy.core.identifiers import carried_start
from proxy.core.moves import moved
from proxy.core.neutral import neutralised
from proxy.core.view import View
from proxy.core.wording import omitted_marker


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    summary: str  # "" when the snapshot only elides tool outputs
    pinned: int  # leading messages sent verbatim when it was made
    covered: int  # messages[pinned:covered] are represented by the summary
    elide_before: int  # bulky tool outputs before this index are elided
    anchor_hash: str  # prefix_hash of messages[:max(covered, elide_before)]
    summary_tokens: int
    tokens_before: int  # request total that triggered the compaction
    tokens_after: int  # planned total right after it
    created_at: float
    updated_at: float
    model: str = ""
    # When POST /sessions/{id}/compact asked for the next request to compact (epoch s);
    # 0: not asked. Kept with the session so every replica sees it.
    compact_requested_at: float = 0.0
    # Where the messages around the anchor sat when it was made (moves.py's
    # ``seen_record``): a client that moves what it re-sends is found out by it.
    seen: str = ""
    # The hash of the covered messages after the pinned ones (``body_hash``): a side
    # request, another system prompt over the same conversation, is found by it.
    body_hash: str = ""

    @property
    def anchor(self) -> int:
        return max(self.covered, self.elide_before)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A session's snapshot as stored, and as this history may use it."""

    stored: Snapshot | None  # what a new snapshot must replace (compare-and-swap)
    # ``stored`` as far as this history starts with what it covers (or, for a side
    # request, its conversation's snapshot: ``side``)
    valid: Snapshot | None
    # Where this history's re-sent messages begin (moves.py): no cut or elision past it.
    settled: int | None = None
    # ``valid`` is another conversation's: this history is a side request over it (its
    # own pinned messages, the same conversation after them). It compacts only what
    # does not fit, into its own slot, never in the background (``side_of``).
    side: bool = False

    @property
    def version(self) -> int:
        """The version a new snapshot replaces; 0 for none."""
        return self.stored.version if self.stored else 0

    @property
    def summary(self) -> str:
        """The usable snapshot's summary, with nothing in it able to speak as the proxy
        however old the release that stored it (stored_neutralised)."""
        return stored_neutralised(self.valid.summary) if self.valid else ""

    @property
    def shown_version(self) -> int:
        """The version of the snapshot this history is shown under (0: none)."""
        return self.valid.version if self.valid else self.version

    def view(self, pinned: int) -> View:
        return view_of(self.valid, pinned)


@lru_cache(maxsize=256)
def stored_neutralised(summary: str) -> str:
    """A stored summary as a handoff may carry it: the model's text neutralised
    (neutral.py), the proxy's own parts as they are (the omitted marker summarize.py
    puts before it, the quoted sections identifiers.py puts after it).

    A summary kept by this release comes back byte for byte; one stored by a release
    that did not neutralise (a rolling upgrade shares the store) is made inert once it
    is read. Cached by text: a warm session renders the same summary every turn, and
    the lookup costs a string hash and compare, not a pass over the text.
    """
    lead = _omitted_lead(summary)
    at = carried_start(summary)
    end = len(summary) if at is None else at
    written = summary[lead:end]
    fresh = neutralised(written)
    return summary if fresh == written else f"{summary[:lead]}{fresh}{summary[end:]}"


_OMITTED_COUNT = re.compile(r"\[compaction-proxy: (\d{1,9}) earlier message")


def _omitted_lead(summary: str) -> int:
    """The length of the omitted marker ``summary`` opens with (0: none)."""
    first = summary.partition("\n")[0]
    count = _OMITTED_COUNT.match(first)
    return len(first) if count and first == omitted_marker(int(count.group(1))) else 0


def valid_snapshot(snapshot: Snapshot | None, history: History) -> Snapshot | None:
    """``snapshot`` if ``history`` still starts with the messages it covers, else None."""
    if snapshot is None:
        return None
    anchor = snapshot.anchor
    valid = (
        snapshot.pinned == history.pinned
        and anchor < len(history.messages)  # the newest message is never covered
        and anchor_matches(
            snapshot.anchor_hash, history.messages, history.digests, anchor, history.seed
        )
    )
    return snapshot if valid else None


def loaded_for(stored: Snapshot | None, history: History) -> Loaded:
    """``stored`` as ``history`` may use it: whole while the history starts with what it
    covers (``valid_snapshot``); else, where the only difference is messages the client
    moved further on (moves.py: each of them found again), up to the first of them, as
    the summary then repeats what the tail shows and loses nothing; else not at all.
    With where the history's re-sent messages begin, so a new cut stops before them."""
    valid = valid_snapshot(stored, history)
    if stored is None or not stored.seen:
        return Loaded(stored, valid)
    move = moved(stored.seen, history.digests, stored.anchor)
    if move is None:
        return Loaded(stored, valid)
    if valid is None and move.kept and stored.pinned == history.pinned:
        valid = _up_to(stored, history, move.gone)
    return Loaded(stored, valid, move.settled)


def body_hash(digests: Sequence[bytes], pinned: int, anchor: int) -> str:
    """The hash of ``digests[pinned:anchor]``: the covered messages, not the pinned ones."""
    return prefix_hash(digests[pinned:anchor], anchor - pinned)


def side_of(stored: Snapshot | None, history: History) -> Snapshot | None:
    """``stored`` as it applies to a side request: ``history`` pins other messages (an
    agent's memory extraction, a title, with their own system prompt) and then starts
    with exactly the messages ``stored`` covers after its pinned ones. None otherwise."""
    if stored is None or not stored.body_hash:
        return None
    shift = history.pinned - stored.pinned
    anchor = stored.anchor + shift
    if not history.pinned <= anchor < len(history.messages):
        return None
    if body_hash(history.digests, history.pinned, anchor) != stored.body_hash:
        return None
    return replace(
        stored,
        pinned=history.pinned,
        covered=stored.covered + shift,
        elide_before=stored.elide_before + shift,
        anchor_hash=prefix_hash(history.digests, anchor),
    )


def _up_to(stored: Snapshot, history: History, end: int) -> Snapshot | None:
    """``stored`` applied to ``history`` only before ``end``: what it covered or elided
    from there on is shown verbatim (None when that leaves no cut: ``end`` is no group
    start past the pinned messages, or the newest message)."""
    if not history.pinned < end < len(history.messages) or history.results[end]:
        return None
    covered = min(stored.covered, end)
    elide_before = max(covered, min(stored.elide_before, end))
    anchor_hash = prefix_hash(history.digests, max(covered, elide_before))
    return replace(stored, covered=covered, elide_before=elide_before, anchor_hash=anchor_hash)


def view_of(snapshot: Snapshot | None, pinned: int) -> View:
    """What the upstream sees of a history under ``snapshot`` (None: all of it)."""
    if snapshot is None:
        return View(covered=pinned, summary_tokens=0, elide_before=pinned)
    return View(
        covered=snapshot.covered,
        summary_tokens=snapshot.summary_tokens,
        elide_before=snapshot.elide_before,
    )
