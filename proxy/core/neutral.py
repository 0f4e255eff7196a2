"""A summarizer's answer made unable to speak as the proxy.

The summarizer writes what the conversation steers it to write: a user turn can get
``</summary>`` and a ``[system] ...`` line into a summary. The handoff frames the
summary between ``<summary>`` tags (wording.py), and with ``summary_role: system`` that
frame is a system message; a summary that closed the frame would speak after it, as the
proxy. So before a summary is kept, what in the model's text imitates the proxy's own
marks is made inert, with look-alike brackets (U+2039 and U+203A) in place of the real ones:

* a ``summary`` tag, in any case or spacing (``</summary >``, ``< /SUMMARY>``);
* a ``[compaction-proxy ...`` marker (trimming's and elision's placeholders);
* a line opening with a role in brackets (``[system]``, ``[ Developer ]``), as the
  summarizer's own transcript labels its messages (transcript.py);
* a line that reads as one of the proxy's headings or sentences once case, spacing and
  ``#`` marks are set aside (the quoted sections' headings, the handoff's introduction).

An exact copy of a quoted section's heading is left as it is: the identifier check
drops that section whole and rebuilds its own (identifiers.restore_identifiers).
Deterministic, so the prefix the upstream sees stays byte-stable; linear in the text.
"""

from __future__ import annotations

import re

from proxy.core.wording import (
    ACKNOWLEDGEMENT,
    CARRIED_HEADING,
    HANDOFF_INTRO,
    OMITTED_HEADING,
    QUOTED_INTRO,
)

OPEN, CLOSE = "\u2039", "\u203a"  # single angle quotation marks: read alike, frame nothing

_TAG = re.compile(r"<(?=[ \t]*/?[ \t]*summary)", re.IGNORECASE)
_MARKER = re.compile(r"\[(?=[ \t]*compaction-proxy)", re.IGNORECASE)
_ROLE_LINE = re.compile(
    r"^([ \t>*_-]*)\[([ \t]*(?:system|developer|user|assistant|tool|function)\b[^\]\n]*)\]?",
    re.IGNORECASE | re.MULTILINE,
)
_SPACE = re.compile(r"\s+")
_LINE_MARKS = "#*_>- \t"


def _plain(line: str) -> str:
    return _SPACE.sub(" ", line.strip(_LINE_MARKS)).strip(" :.").lower()


# What the proxy writes around a summary, as a line of the model's would read.
_OWN = frozenset(
    _plain(text)
    for text in (CARRIED_HEADING, OMITTED_HEADING, HANDOFF_INTRO, QUOTED_INTRO, ACKNOWLEDGEMENT)
)
_EXACT = frozenset({CARRIED_HEADING, OMITTED_HEADING})


def neutralised(text: str) -> str:
    """``text`` (a summarizer's answer) with every imitation of the proxy's marks inert."""
    text = _TAG.sub(OPEN, text)
    text = _MARKER.sub(OPEN, text)
    text = _ROLE_LINE.sub(_role_line, text)
    if not any(_plain(line) in _OWN for line in text.splitlines()):
        return text
    return "\n".join(_own_line(line) for line in text.split("\n"))


def _role_line(match: re.Match[str]) -> str:
    lead, label = match.group(1), match.group(2)
    closed = match.group(0).endswith("]")
    return f"{lead}{OPEN}{label}{CLOSE if closed else ''}"


def _own_line(line: str) -> str:
    if line.rstrip() in _EXACT or _plain(line) not in _OWN:
        return line
    return f"{OPEN}{line.strip()}{CLOSE}"
