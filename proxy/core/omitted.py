"""What messages left out of a view leave behind: the values they held, quoted.

Two steps drop text without asking a model: trimming, when a summary failed or
the session is backed off (trim.py), drops the oldest messages; elision replaces
old bulky tool outputs with a placeholder (rebuild.py). Left at that, a later
question about a port or a ticket id gets a confident invention. So both keep the
values those messages held (values.py), deterministically:

* a trimmed view carries a recap of the dropped span after the one-line marker:
  ``OMITTED_HEADING``, then one line per value (within the bounds settings and
  labelled facts are kept first, a log's repeated fields last, values only the
  assistant's turns hold after all of them, the most recent first within each:
  salience.py), each with its label, a few words of its
  sentence and the role of its message (``- user: `port: 8443` (from `so the port
  is 8443 on staging`)``). It is
  quoted data under a heading that says so, never part of a system message
  (rebuild.py moves it to the user turn after a system handoff);
* an elided tool output's placeholder lists the values it held, in reading order,
  within ``ELIDED_VALUE_CHARS``, settings first when not all fit (``SERVER_PORT =
  7781`` survives the elision).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cachetools import LRUCache

from proxy.core.salience import ASSISTANT, heard, keep_order, tiers
from proxy.core.transcript import span_sources
from proxy.core.values import SLICE_CHARS, Value, find_values, quoted, quoted_line
from proxy.core.wording import OMITTED_HEADING
from proxy.types import ChatMessage

# Trimming runs on the event loop: per call it reads at most this much text not read
# before (newest first; a few ms: bench/README.md), and keeps what each
# message held (``_held``), so a long failing conversation reads each dropped message
# once, and a span too big for one call is read over the next turns.
DIGEST_SCANNED = 32 * 1024
# No line is shorter ("- tool: `a=1`"): a recap with less room left is full.
_SHORTEST_LINE = 14
# Values kept per message: a tool output of a thousand settings keeps its last ones.
_PER_MESSAGE = 32
# Digest text is mostly digits, names and punctuation, which tokenize densely: its
# tokens are estimated as characters / 2.5 (English prose is nearer 4).
_CHARS_PER_TOKEN = 2.5
# An elided output's placeholder quotes its values in at most this many characters,
# read from its first slice; view.ELIDED_TOKENS allows for them.
ELIDED_VALUE_CHARS = 160
# Per process, keyed by a message's digest (digest.py: XXH3 seeded per tenant): the
# values each message held (role and settled values, bounded in bytes), and the
# values an elided output's placeholder quotes (it is elided again every turn).
_held: LRUCache[bytes, tuple[str, tuple[Value, ...]]] = LRUCache(
    maxsize=8 * 1024 * 1024,
    getsizeof=lambda held: 64 + sum(64 + len(v.shown) + len(v.context) for v in held[1]),
)
_elided: LRUCache[bytes, str] = LRUCache(maxsize=4096)


def recap_tokens(recap: str) -> int:
    """The estimated cost of ``recap`` in a view."""
    return math.ceil(len(recap) / _CHARS_PER_TOKEN) if recap else 0


def recap_chars(tokens: int) -> int:
    """The characters a recap of ``tokens`` tokens may have."""
    return int(tokens * _CHARS_PER_TOKEN)


def omitted_recap(
    messages: Sequence[ChatMessage],
    digests: Sequence[bytes],
    kept: str,
    max_chars: int,
    max_count: int,
) -> str:
    """The recap of ``messages`` (dropped, oldest first; ``digests`` theirs): their
    values that ``kept`` (the summary the view still carries) lacks, at most
    ``max_count`` lines in at most ``max_chars`` characters heading included, the most
    recent first; "" if none."""
    found = _values(messages, digests)
    chosen: dict[int, str] = {}
    size = len(OMITTED_HEADING) + 1
    # Settings and labelled facts first, a log's repeated fields last, what only the
    # assistant said after all of them (salience.py).
    ranks = heard(tiers([value for value, _, _ in found]), [said for _, _, said in found])
    for i in keep_order(ranks):
        if len(chosen) >= max_count or max_chars - size < _SHORTEST_LINE:
            break
        value, role, _ = found[i]
        if value.kept_in(kept):
            continue
        line = _fitted_line(role, value, max_chars - size - 1)
        if line is not None:
            chosen[i] = line
            size += len(line) + 1
    if not chosen:
        return ""
    return "\n".join((OMITTED_HEADING, *(chosen[i] for i in sorted(chosen))))


def _values(
    messages: Sequence[ChatMessage], digests: Sequence[bytes]
) -> list[tuple[Value, str, bool]]:
    """Each value ``messages`` held with the role it was last seen under and whether a
    turn not the assistant's holds it, in order of last occurrence; what no earlier call
    read is read newest first, ``DIGEST_SCANNED`` characters at most (the rest on later
    calls)."""
    budget = DIGEST_SCANNED
    held: list[tuple[str, tuple[Value, ...]]] = []
    for message, digest in zip(reversed(messages), reversed(digests), strict=True):
        known = _held.get(digest) if digest else None
        if known is None:
            if budget <= 0:
                continue
            role, text = span_sources([message])[0]
            whole = len(text) <= budget
            found = find_values(text[-budget:])[-_PER_MESSAGE:]
            budget -= len(text)
            known = (role, tuple(value.settled() for value in found))
            if digest and whole:
                _held[digest] = known
        held.append(known)
    last: dict[str, tuple[Value, str, bool]] = {}
    for role, values in reversed(held):
        for value in values:
            earlier = last.pop(value.key, None)  # re-inserted: dict order is order of use
            said = role != ASSISTANT or (earlier is not None and earlier[2])
            if earlier and earlier[0].labelled and not value.labelled:
                value = earlier[0]
            last[value.key] = (value, role, said)
    return list(last.values())


def _fitted_line(role: str, value: Value, room: int) -> str | None:
    """``value``'s line with its context if that fits in ``room``, else without it."""
    for context in (True, False):
        line = quoted_line(role, value, context=context)
        if len(line) <= room:
            return line
    return None


def elided_values(message: ChatMessage, digest: bytes) -> str:
    """The values an elided tool output held, quoted, in reading order and within
    ``ELIDED_VALUE_CHARS``: ```SERVER_PORT = 7781`, `port: 8443``; "" if none."""
    if digest and digest in _elided:
        return _elided[digest]
    text = span_sources([message])[0][1][:SLICE_CHARS]
    found = sorted(find_values(text), key=lambda v: v.where[1])
    chosen: dict[int, str] = {}
    size = 0
    for i in keep_order(tiers(found), newest_first=False):
        item = quoted(found[i].shown)
        if size + len(item) + 2 > ELIDED_VALUE_CHARS:
            continue
        chosen[i] = item
        size += len(item) + 2
    values = ", ".join(chosen[i] for i in sorted(chosen))
    if digest:
        _elided[digest] = values
    return values
