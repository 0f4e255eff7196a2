"""What messages left out of a view leave behind: the values they held, quoted.

Two steps drop text without asking a model: trimming, when a summary failed or
the session is backed off (trim.py), drops the oldest messages; elision replaces
old bulky tool outputs with a placeholder (rebuild.py). Left at that, a later
question about a port or a ticket id gets a confident invention. So both keep the
values those messages held (values.py), deterministically:

* a trimmed view carries a digest of the dropped span after the one-line marker:
  ``OMITTED_HEADING``, then one line per value, most recent kept first within the
  bounds, each with its label, a few words of its sentence and the role of its
  message (``- user: `port: 8443` (from `so the port is 8443 on staging`)``). It is
  quoted data under a heading that says so, never part of a system message
  (rebuild.py moves it to the user turn after a system handoff);
* an elided tool output's placeholder lists the values it held, in reading order,
  within ``ELIDED_VALUE_CHARS`` (``SERVER_PORT = 7781`` survives the elision).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cachetools import LRUCache

from proxy.identifiers import OMITTED_HEADING
from proxy.transcript import span_sources
from proxy.types import ChatMessage
from proxy.values import SLICE_CHARS, Value, find_values, quoted, quoted_line, values_by_role

# The dropped span's newest text read for its digest: trimming runs on the event loop,
# and this much costs it a few milliseconds (values.py scans about 50 MB/s).
DIGEST_SCANNED = 64 * 1024
# Digest text is mostly digits, names and punctuation, which tokenize densely: its
# tokens are estimated as characters / 2.5 (English prose is nearer 4).
_CHARS_PER_TOKEN = 2.5
# An elided output's placeholder quotes its values in at most this many characters,
# read from its first slice; view.ELIDED_TOKENS allows for them.
ELIDED_VALUE_CHARS = 160
# Per process: an elided output is elided again on every later turn. Keyed by the
# message's digest (digest.py: per tenant), bounded in entries and so in bytes.
_elided: LRUCache[bytes, str] = LRUCache(maxsize=4096)


def digest_tokens(digest: str) -> int:
    """The estimated cost of ``digest`` in a view."""
    return math.ceil(len(digest) / _CHARS_PER_TOKEN) if digest else 0


def digest_chars(tokens: int) -> int:
    """The characters a digest of ``tokens`` tokens may have."""
    return int(tokens * _CHARS_PER_TOKEN)


def omitted_digest(
    messages: Sequence[ChatMessage], kept: str, max_chars: int, max_count: int
) -> str:
    """The digest of ``messages`` (dropped, oldest first): their values that ``kept``
    (the summary the view still carries) lacks, at most ``max_count`` lines in at most
    ``max_chars`` characters heading included, the most recent first; "" if none."""
    found = values_by_role(span_sources(messages), DIGEST_SCANNED)
    lines: list[str] = []
    size = len(OMITTED_HEADING) + 1
    for value, role in reversed(found):
        if len(lines) >= max_count:
            break
        if value.kept_in(kept):
            continue
        line = _fitted_line(role, value, max_chars - size - 1)
        if line is not None:
            lines.append(line)
            size += len(line) + 1
    if not lines:
        return ""
    lines.reverse()
    return "\n".join((OMITTED_HEADING, *lines))


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
    shown: list[str] = []
    size = 0
    for value in sorted(find_values(text), key=lambda v: v.where[1]):
        item = quoted(value.shown)
        if size + len(item) + 2 > ELIDED_VALUE_CHARS:
            continue
        shown.append(item)
        size += len(item) + 2
    values = ", ".join(shown)
    if digest:
        _elided[digest] = values
    return values
