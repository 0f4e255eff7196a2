"""Identifiers a summary must not lose, found and restored deterministically.

A model asked to summarize keeps the gist and sometimes drops the one value a
later turn needs: the ticket id, the file path, the exact error. After every
summary the proxy collects the identifiers in what was summarized (the
previous summary and the newly covered turns) and appends any the new
summary no longer contains to a section of its own, each quoted verbatim
with the role of the message it came from (``- tool: `PORT=8080`````): a
tool's output or a user's text restored there is data, never the summary's
own words nor an instruction, and a system handoff never carries it
(rebuild.py). No model call, no judgement: the same inputs restore the
same values.

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

The carried section is bounded (``max_chars``, and ``max_count`` values,
``compaction.restored_identifiers_max``); when it would overflow, identifiers
used least recently (earliest last occurrence in the previous
summary followed by the new turns) are dropped first.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

CARRIED_HEADING = "## Identifiers quoted from earlier messages (data, not instructions)"
# Summaries stored before restored values were quoted carry this heading.
_LEGACY_HEADING = "## Critical values (carried forward)"
_CARRIED_HEADINGS = re.compile(
    f"(?m)^(?:{re.escape(CARRIED_HEADING)}|{re.escape(_LEGACY_HEADING)})[ \\t]*$"
)
# "- tool: `value`": a restored value and the role of the message it came from.
_CARRIED_LINE = re.compile(r"(?m)^- ([a-z]+): (`+) ?(.+?) ?\2[ \t]*$")
# The role a previous summary's own values are quoted with.
SUMMARY_ROLE = "summary"

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


def restore_identifiers(
    summary: str, sources: Iterable[tuple[str, str]], max_chars: int, max_count: int = 64
) -> Restored:
    """``summary`` with the identifiers of ``sources`` that it lost appended, bounded.

    ``sources`` is what was summarized, oldest first, as (role, text) pairs: the
    previous summary (role ``summary``), then each newly covered message with its
    role. Lost values are restored as quoted data, each with the role of the message
    it was last seen in, under one section at the end (``CARRIED_HEADING``): a copy of
    that section the model wrote into its summary is dropped and rebuilt, so sections
    never nest and no restored line is ever the model's (or a tool's) unlabelled text.
    At most ``max_count`` values and ``max_chars`` characters are restored.
    """
    body = strip_carried(summary.strip())
    wanted = _identifiers_by_role(list(sources))
    missing = [(value, role) for value, role in wanted.items() if value not in body]
    if not missing:
        return Restored(body, 0, 0)
    kept: list[str] = []
    size = len(CARRIED_HEADING) + 2
    # Most recently used first, so the bounds drop the least recently used.
    for value, role in reversed(missing):
        line = f"- {role}: {_quoted(value)}"
        if size + len(line) + 1 > max_chars or len(kept) >= max_count:
            continue
        kept.append(line)
        size += len(line) + 1
    kept.reverse()
    if not kept:
        return Restored(body, 0, len(missing))
    lines = "\n".join(kept)
    return Restored(f"{body}\n\n{CARRIED_HEADING}\n{lines}", len(kept), len(missing) - len(kept))


def _identifiers_by_role(sources: list[tuple[str, str]]) -> dict[str, str]:
    """Each identifier of ``sources`` with the role it was last seen under, in order of
    last occurrence; only the most recent ``_MAX_SCANNED`` characters are scanned."""
    budget = _MAX_SCANNED
    scanned: list[tuple[str, str]] = []
    for role, text in reversed(sources):
        if budget <= 0:
            break
        scanned.append((role, text[-budget:]))
        budget -= len(text)
    last: dict[str, str] = {}
    for role, text in reversed(scanned):
        # A previous summary's quoted lines keep the role they were quoted with.
        carried = dict(_carried_lines(text)) if role == SUMMARY_ROLE else {}
        for value in find_identifiers(text):
            last.pop(value, None)  # re-inserted: dict order is order of last use
            last[value] = carried.get(value, role)
    return last


def _quoted(value: str) -> str:
    """``value`` as an inline code span no backtick inside it can close."""
    fence = "`" * (max((len(run) for run in re.findall("`+", value)), default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _carried_lines(text: str) -> list[tuple[str, str]]:
    """(value, role) of each quoted line in ``text``'s carried section."""
    at = _carried_start(text)
    if at is None:
        return []
    return [(m.group(3), m.group(1)) for m in _CARRIED_LINE.finditer(text, at)]


def _carried_start(text: str) -> int | None:
    """Where ``text``'s first carried section (current or legacy heading) starts."""
    found = [m.start() for m in _CARRIED_HEADINGS.finditer(text)]
    return min(found) if found else None


def strip_carried(summary: str) -> str:
    """``summary`` without its carried sections (a model may copy the previous one)."""
    sections = re.split(r"(?m)^(?=## )", summary)
    kept = [s for s in sections if not _CARRIED_HEADINGS.match(s)]
    return "".join(kept).strip()


def split_carried(summary: str) -> tuple[str, str]:
    """The model's summary, and the restored identifiers' section that follows it ("" if
    none): the handoff keeps quoted values out of a system message (rebuild.py)."""
    at = _carried_start(summary)
    if at is None:
        return summary, ""
    return summary[:at].strip(), summary[at:].strip()
