"""Where a client moves messages it re-sends, so a summary never folds one in.

Some clients re-send a fixed exchange every turn after the conversation so far, not
at its start: aider sends its chat files as a user message and an "Ok." after the
turns done, before the newest message, so each turn that exchange sits two positions
further on. A summary whose cut falls after it covers messages the next history no
longer holds where they were: by DESIGN invariant 2 that snapshot no longer applies,
and every turn would summarize afresh, inline.

So a snapshot remembers where the messages around its anchor sat (``seen_record``: a
hash of everything before them, then a short digest of each, to the history's end),
and a later history shows which of them moved further on (``moved``). Two uses:

- ``settled``: the first position holding a remembered message that moved on; what
  is there is re-sent, not said, so cuts and elisions stop before it (plan.py) and
  the next history still starts with what the summary covers;
- ``kept``: where the history starts with the snapshot's messages but for ones that
  moved on, each of them found again further on, the snapshot still applies up to
  the first that moved (snapshot.py's ``loaded_for``): the summary then also tells of
  messages the tail shows verbatim, which repeats them and loses nothing.

A client that only appends moves nothing; one that edits or rewinds changes messages
rather than moving them (a changed message is found nowhere further on), and is not
held back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.digest import prefix_hash

# Covered messages remembered before the anchor: a first summary that folded a
# re-sent exchange in is found out by the next history (its last messages moved on).
SEEN_COVERED = 8
# At most this many positions remembered in all (the newest): under a kilobyte.
SEEN_LIMIT = 48
_SHORT = 8  # bytes of each digest kept: a collision only holds a cut back
_HASH = 32  # hex characters of prefix_hash


@dataclass(frozen=True, slots=True)
class Moved:
    """How a history differs from the one a ``seen_record`` was made of."""

    gone: int  # the first remembered position now holding another message
    settled: int | None  # the first position of a remembered message found further on
    kept: bool  # each one before the anchor that is not where it was is found further on


def seen_record(digests: Sequence[bytes], anchor: int, pinned: int) -> str:
    """Where the messages around an anchor at ``anchor`` sat: the first position, the
    hash of the messages before it, then each message's short digest to the end."""
    start = max(pinned, anchor - SEEN_COVERED, len(digests) - SEEN_LIMIT)
    if start >= len(digests):
        return ""
    shorts = "".join(d[:_SHORT].hex() for d in digests[start:])
    return f"{start}:{prefix_hash(digests, start)}:{shorts}"


def _parsed(seen: str) -> tuple[int, str, list[bytes]] | None:
    """``seen_record``'s parts; None for anything it did not write (a stored value)."""
    start, _, rest = seen.partition(":")
    before, _, shorts = rest.partition(":")
    width = 2 * _SHORT
    if not start.isdigit() or len(before) != _HASH or not shorts:
        return None
    if len(shorts) % width or len(shorts) > width * SEEN_LIMIT:
        return None
    try:
        values = [bytes.fromhex(shorts[i : i + width]) for i in range(0, len(shorts), width)]
    except ValueError:
        return None
    return int(start), before, values


def moved(seen: str, digests: Sequence[bytes], anchor: int) -> Moved | None:
    """How ``digests`` moved the messages ``seen`` (a snapshot anchored at ``anchor``)
    remembers; None when each is where it was, or the messages before them changed (an
    edit: nothing moved). The usual case costs a comparison per remembered message."""
    parsed = _parsed(seen) if seen else None
    if parsed is None:
        return None
    start, before, shorts = parsed
    gone = [
        (start + i, short)
        for i, short in enumerate(shorts)
        if start + i >= len(digests) or digests[start + i][:_SHORT] != short
    ]
    if not gone or start > len(digests) or prefix_hash(digests, start) != before:
        return None
    later: dict[bytes, int] = {}  # each short digest's first position after the first gone
    for at in range(len(digests) - 1, gone[0][0], -1):
        later[digests[at][:_SHORT]] = at
    ahead = {pos: at for pos, short in gone if (at := later.get(short, -1)) > pos}
    kept = all(pos in ahead for pos, _ in gone if pos < anchor)
    return Moved(gone[0][0], min(ahead.values(), default=None), kept)
