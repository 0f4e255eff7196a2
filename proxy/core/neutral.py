"""A summarizer's answer made unable to speak as the proxy.

The summarizer writes what the conversation steers it to write: a user turn can get
``</summary>`` and a ``[system] ...`` line into a summary. The handoff frames the
summary between ``<summary>`` tags (wording.py), and with ``summary_role: system`` that
frame is a system message; a summary that closed the frame would speak after it, as the
proxy. So before a summary is kept, what in the model's text imitates the proxy's own
marks is made inert, with look-alike brackets (U+2039 and U+203A) in place of the real ones:

* a ``summary`` tag, in any case or spacing (``</summary >``, ``<\\n/SUMMARY>``), written
  with an entity (``&lt;/summary&gt;``, ``&#60;/summary>``) or an escaped slash;
* a ``[compaction-proxy ...`` marker (trimming's and elision's placeholders), with any
  space or dash between its words;
* a line opening with a role in brackets (``[system]``, ``## [ Developer ]``,
  ``1. [user]``), as the summarizer's own transcript labels its messages (transcript.py);
* a line that reads as one of the proxy's headings or sentences once case, spacing and
  ``#`` marks are set aside (the quoted sections' headings, the handoff's introduction).

What a reader takes for a line break is one here: every line separator becomes ``\\n``,
and format characters (Unicode category Cf: zero-width spaces, joiners, bidi controls),
which a reader does not see, are dropped, so ``</sum\\u200bmary>`` is a tag. Matching also
sees each character's compatibility form (NFKC, one character for one), so fullwidth
``\\uff1c/summary\\uff1e`` is one too; the text kept has its own characters.

An exact copy of a quoted section's heading is left as it is: the identifier check
drops that section whole and rebuilds its own (identifiers.restore_identifiers), and
both read "is this the heading" alike (wording.is_quoted_heading).

The frame is not made one the model cannot write (say a closing tag carrying a hash of
the summary): the model that reads the handoff checks no hash, so a plain ``</summary>``
would read as the end of the frame all the same; what the reader sees has to be inert.
Deterministic, so the prefix the upstream sees stays byte-stable; linear in the text.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from proxy.core.wording import (
    ACKNOWLEDGEMENT,
    CARRIED_HEADING,
    HANDOFF_INTRO,
    OMITTED_HEADING,
    QUOTED_INTRO,
    is_quoted_heading,
)

OPEN, CLOSE = "\u2039", "\u203a"  # single angle quotation marks: read alike, frame nothing

# Line separators other than "\n" (str.splitlines' set, "\r\n" as one).
_BREAKS = re.compile("\r\n?|[\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e]")
_ASCII_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e"
# Unicode's format characters (category Cf, Unicode 14, and the rest of one range Unicode
# 15 fills; tests/core/test_neutral.py checks them against the running unicodedata).
_FORMAT_RANGES = (
    (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F),
    (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)  # fmt: skip
FORMAT_CHARS = "".join(f"{chr(a)}-{chr(b)}" for a, b in _FORMAT_RANGES)
_FORMAT = re.compile(f"[{FORMAT_CHARS}]+")
# What non-ASCII text must hold for either pattern to change it: a set lookup per
# distinct character is far cheaper than a character-class scan of the whole text.
_UNSEEN = frozenset(chr(c) for a, b in _FORMAT_RANGES for c in range(a, b + 1)) | frozenset(
    "\u2028\u2029\x85" + _ASCII_BREAKS
)

# Each pattern opens with one literal character, which Python's re finds fast; an
# alternation or a class at the start would be tried at every position.
_AFTER_LT = r"(?=\s*\\?\s*(?:(?:/|&#0*47;?|&#x0*2f;?|&sol;)\s*)?summary)"
_TAGS = (
    re.compile(rf"<{_AFTER_LT}", re.IGNORECASE),
    re.compile(rf"&(?:lt;?|#0*60;?|#x0*3c;?){_AFTER_LT}", re.IGNORECASE),
)
_MARKER = re.compile(r"\[(?=\s*compaction[\s_\-\u2010-\u2015\u2212]*proxy)", re.IGNORECASE)
_ROLE = r"(\s*(?:system|developer|user|assistant|tool|function)\b[^\]\n]*)(\])?"
_ROLES = (
    re.compile(rf"\[{_ROLE}", re.IGNORECASE),
    re.compile(rf"&(?:#0*91;?|#x0*5b;?|lsqb;|lbrack;){_ROLE}", re.IGNORECASE),
)
# What may come before a role on its line: marks, spaces, a list's number.
_ROLE_LEAD = re.compile(r"(?:[^\w\n]|\d+[.)])*")
_LINE_MARKS = "#*_>- \t"


def _plain(line: str) -> str:
    # split and join: a regex for runs of spaces would be tried at every position.
    return " ".join(line.strip(_LINE_MARKS).split()).strip(" :.").lower()


# What the proxy writes around a summary, as a line of the model's would read.
_OWN = frozenset(
    _plain(text)
    for text in (CARRIED_HEADING, OMITTED_HEADING, HANDOFF_INTRO, QUOTED_INTRO, ACKNOWLEDGEMENT)
)
# A line shorter than this cannot read as one of them; one longer than the other bound
# would need pages of padding to: neither is worth a _plain.
_SHORTEST = min(map(len, _OWN))
_LONGEST = 4 * max(map(len, _OWN)) + 256
# A line reading as one of them holds each of its words: one holding none of these (the
# longest word of each) is not worth a _plain either.
_BYTE_KEYS = frozenset(max(re.findall(r"[a-z]+", own), key=len).encode() for own in _OWN)


def neutralised(text: str) -> str:
    """``text`` (a summarizer's answer) with every imitation of the proxy's marks inert."""
    text = _normal(text)
    folded = _folded(text)
    edits = [(m.start(), m.end(), OPEN) for tag in _TAGS for m in tag.finditer(folded)]
    edits += [(m.start(), m.end(), OPEN) for m in _MARKER.finditer(folded)]
    for role in _ROLES:
        for m in role.finditer(folded):
            if not _ROLE_LEAD.fullmatch(folded, folded.rfind("\n", 0, m.start()) + 1, m.start()):
                continue
            edits.append((m.start(), m.start(1), OPEN))
            if m.group(2):
                edits.append((m.start(2), m.end(2), CLOSE))
    if edits:
        text = _spliced(text, edits)
        folded = _folded(text)
    own = [
        (start, end, f"{OPEN}{text[start:end].strip()}{CLOSE}")
        for start, end in _key_lines(folded)
        if _own(text[start:end], folded[start:end])
    ]
    return _spliced(text, own) if own else text


def _key_lines(folded: str) -> list[tuple[int, int]]:
    """The (start, end) of each line of ``folded`` that holds one of ``_BYTE_KEYS``, found by
    substring search: the rest cannot read as the proxy's own text."""
    # One byte a character (non-ASCII as "?"), lowered: positions carry over, and bytes
    # are lowered and searched far faster than a str with non-ASCII in it.
    low = folded.encode("ascii", "replace").lower()
    spans = set()
    for key in _BYTE_KEYS:
        at = low.find(key)
        while at >= 0:
            start = low.rfind(b"\n", 0, at) + 1
            end = low.find(b"\n", at)
            end = len(low) if end < 0 else end
            spans.add((start, end))
            at = low.find(key, end)
    return sorted(spans)


def _normal(text: str) -> str:
    """``text`` with every line separator ``\\n`` and no format character."""
    if text.isascii():
        if any(c in text for c in _ASCII_BREAKS):
            return _BREAKS.sub("\n", text)
        return text
    if _UNSEEN.isdisjoint(text):
        return text
    return _FORMAT.sub("", _BREAKS.sub("\n", text))


def _own(line: str, seen: str) -> bool:
    """Whether ``line`` (``seen`` as matching sees it) reads as the proxy's own text and
    is not the exact heading identifiers.py reads as one and drops."""
    if not _SHORTEST <= len(seen) <= _LONGEST or is_quoted_heading(line):
        return False
    return _plain(seen) in _OWN


def _spliced(text: str, edits: list[tuple[int, int, str]]) -> str:
    out, at = [], 0
    for start, end, mark in sorted(edits):
        if start < at:  # overlapping matches: the first one made it inert
            continue
        out += [text[at:start], mark]
        at = end
    out.append(text[at:])
    return "".join(out)


def _folded(text: str) -> str:
    """``text`` with each character that has a one-character compatibility form in that
    form (fullwidth ``\\uff1c`` as ``<``): as long as ``text``, so positions carry over."""
    if text.isascii():
        return text
    table = {ord(c): f for c in set(text) if (f := _fold(c)) is not None}
    return text.translate(table) if table else text


@lru_cache(maxsize=4096)
def _fold(char: str) -> str | None:
    if char.isascii():
        return None
    form = unicodedata.normalize("NFKC", char)
    return form if len(form) == 1 and form != char and form != "\n" else None
