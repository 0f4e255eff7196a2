"""Identifiers a summary must not lose, found and restored deterministically.

A model asked to summarize keeps the gist and sometimes drops the one value a
later turn needs: the ticket id, the file path, the exact error. After every
summary the proxy collects the identifiers in what was summarized (the
previous summary and the newly covered turns) and appends any the new
summary no longer contains, verbatim, to a section of its own. No model call,
no judgement: the same inputs restore the same values.

What counts as an identifier (``_RULES``, first match wins per span of text):

* ``KEY=VALUE`` facts: a name of letters, digits, ``_.-`` then ``=`` and a
  value without spaces (``color=teal``, ``FACT build_id=8812``, ``PORT=8080``),
  except names that say password, secret, token, key, auth or the like;
* URLs (``http://``, ``https://``), without trailing punctuation, user
  credentials, or a query that names a token, key, secret or signature;
* file paths with a directory and an extension (``src/app/main.py``,
  ``/etc/nginx/nginx.conf``, ``./run.sh``);
* quoted error messages: text in backticks or double quotes, 8 to 200
  characters, that says error, exception, failed, denied, refused, invalid,
  not found, timeout or timed out;
* ids: a run of letters, digits, ``_`` and ``-`` of 6 to 80 characters
  with letters and at least two digits (``call_8f3a2c``, ``req-77121``,
  ``JIRA-4711``, UUIDs, git hashes; not ``python3`` or ``gpt-4o``);
* error codes: upper-case words joined by underscores (``ERR_SSL_PROTOCOL``),
  ``E`` and 3 to 6 digits (``E0425``), errno names (``ECONNREFUSED``).

The carried section is bounded (``max_chars``); when it would overflow,
identifiers used least recently (earliest last occurrence in the previous
summary followed by the new turns) are dropped first.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

CARRIED_HEADING = "## Critical values (carried forward)"

_ERROR_WORDS = r"(?i:error|exception|failed|failure|denied|refused|invalid|not found|timed? ?out)"
_RULES = re.compile(
    "|".join(
        (
            r"(?P<kv>(?<![\w.-])[A-Za-z_][\w.-]{0,63}=[^\s,;'\"`)\]}]{1,200})",
            r"(?P<url>https?://[^\s<>\"'`)\]}]{2,500})",
            r"(?P<path>(?<![\w/.-])(?:\.{1,2}/|/)?(?:[\w.-]+/)+[\w-]+\.[A-Za-z0-9]{1,10}(?![\w/]))",
            rf"(?P<quoted>`[^`\n]{{0,200}}{_ERROR_WORDS}[^`\n]{{0,200}}`"
            rf"|\"[^\"\n]{{0,200}}{_ERROR_WORDS}[^\"\n]{{0,200}}\")",
            # Cheap to try: the digit check is one scan of the token; the rest is in _clean.
            r"(?P<id>(?<![\w-])(?=[\w-]*[0-9])[A-Za-z0-9][\w-]{5,79}(?![\w-]))",
            r"(?P<code>(?<![\w-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])"
            r"|(?<![\w-])E[0-9]{3,6}(?![\w-])"
            r"|(?<![\w-])E(?:CONN|NO|ACCES|TIMEDOUT|ADDR|PIPE|HOST|NET|PERM|EXIST|INVAL|AGAIN"
            r"|BUSY|ISDIR|NOTDIR|MFILE)[A-Z]*(?![\w-]))",
        )
    )
)
_TRAILING = ".,:;!?"
# Values the check never copies into a stored summary: credentials are not facts to
# carry forward, and snapshots outlive the conversation that held them.
_SECRET_NAME = re.compile(
    r"pass|secret|token|api[_-]?key|auth|credential|private|signature|session|cookie", re.I
)
# Python's re holds the GIL for a whole call, even in a worker thread: scan in
# slices (about 5 ms each) so the event loop gets its turn between them, and only
# the most recent text of a huge span (older identifiers are likely in the
# previous summary already).
_SLICE_CHARS = 16 * 1024
_MAX_SCANNED = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Restored:
    """The summary to keep, and how many identifiers had to be put back into it."""

    summary: str
    restored: int
    dropped: int  # lost by the model and not restored: the section's bound was hit


def find_identifiers(text: str) -> list[str]:
    """Identifiers in ``text``, each once, in order of last occurrence (most recent last)."""
    last: dict[str, None] = {}
    for piece in _slices(text[-_MAX_SCANNED:]):
        for match in _RULES.finditer(piece):
            value = _clean(match)
            if value is None:
                continue
            last.pop(value, None)  # re-inserted: dict order is order of last use
            last[value] = None
        time.sleep(0)  # let other threads (the event loop) take the GIL
    return list(last)


def _slices(text: str) -> list[str]:
    """``text`` cut into pieces of about _SLICE_CHARS, at whitespace where there is some."""
    pieces = []
    start = 0
    while start < len(text):
        end = min(start + _SLICE_CHARS, len(text))
        if end < len(text):
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            end = cut + 1 if cut > start else end
        pieces.append(text[start:end])
        start = end
    return pieces


def _clean(match: re.Match[str]) -> str | None:
    kind = match.lastgroup
    value = match.group(0)
    if kind == "quoted":
        value = value[1:-1].strip()
        return value if len(value) >= 8 else None
    if kind in ("url", "path", "kv"):
        value = value.rstrip(_TRAILING)
    if kind == "kv" and _SECRET_NAME.search(value.split("=", 1)[0]):
        return None
    if kind == "url":
        return _public_url(value)
    if kind == "id" and (
        sum(c.isdigit() for c in value) < 2 or not any(c.isalpha() for c in value)
    ):
        return None  # an id mixes letters and at least two digits
    return value or None


def _public_url(url: str) -> str | None:
    """The URL without credentials: no userinfo, no query when it carries a secret."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query and any(_SECRET_NAME.search(name) for name, _ in parse_qsl(query)):
        query = ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)) or None


def restore_identifiers(summary: str, sources: Iterable[str], max_chars: int) -> Restored:
    """``summary`` with the identifiers of ``sources`` that it lost appended, bounded.

    ``sources`` is what was summarized, oldest first (the previous summary, then
    the transcript of the new turns). Values are restored under one carried
    section at the end; a summary that already has one (copied from the previous
    summary by the model) gets its lines added there, so sections never nest.
    """
    summary = summary.strip()
    wanted = find_identifiers("\n".join(sources))
    missing = [value for value in wanted if value not in summary]
    if not missing:
        return Restored(summary, 0, 0)
    kept: list[str] = []
    size = len(CARRIED_HEADING) + 2
    # Most recently used first, so the bound drops the least recently used.
    for value in reversed(missing):
        line = f"- {value}\n"
        if size + len(line) > max_chars:
            continue
        kept.append(value)
        size += len(line)
    kept.reverse()
    if not kept:
        return Restored(summary, 0, len(missing))
    lines = "\n".join(f"- {value}" for value in kept)
    at = summary.rfind(CARRIED_HEADING)
    if at != -1 and "\n## " not in summary[at + len(CARRIED_HEADING) :]:
        restored = f"{summary}\n{lines}"  # the section is already last: extend it
    else:
        restored = f"{summary}\n\n{CARRIED_HEADING}\n{lines}"
    return Restored(restored, len(kept), len(missing) - len(kept))
