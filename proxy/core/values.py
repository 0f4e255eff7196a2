"""Values a later turn may need back, found deterministically in text, with their labels.

One extraction for everything that keeps values past a lossy step: the identifier
check after a summary (identifiers.py) and the digest a trimmed view or an elided
tool output carries instead of the messages it left out (omitted.py). No model
call, no judgement: the same text gives the same values.

What counts (``value_rules.RULES``, first match wins at a position; ``Value.shown``
is how it is quoted):

* ``KEY=VALUE`` facts (``color=teal``, ``PORT=8080``), and with spaces around the
  ``=`` when the key reads as a setting (``SERVER_PORT = 7781``, ``db.port = 5432``;
  not ``i = 0``); a constant-case key given a value in words or after a colon
  (``SERVER_PORT is 7781`` -> ``SERVER_PORT: 7781``), a dotted or snake-case key
  after a colon (``server.port: 8443``); never a key that names a secret;
* labelled values in prose: a label word, a few linking words, a value
  (``the port is 8443`` -> ``port: 8443``, ``build number 48213`` -> ``build:
  48213``, ``budget of $37,500`` -> ``budget: $37,500``, ``due 2026-03-14``,
  ``ticket id: TCK-90417``). The value must look like one: it has a digit, is an
  amount, a date or a quantity (read whole: ``37,500``, ``2.5 seconds``, ``15%``),
  or (labels that name people and things: ``owner is Dana Whitfield``, ``codename
  Bluefin``, ``our reviewer, Ann Lee``) is capitalised words. A few other words of
  its clause may stand between a label and a value that cannot be another word's
  (an amount, a date, a quantity; a name after ``is``). A number without a label
  (``we had 42 of them``) is never a value;
* URLs (no credentials, no query that names a secret), file paths with a directory
  and an extension, quoted error messages, ids (letters and at least two digits:
  ``call_8f3a2c``, ``JIRA-4711``), error codes (``ERR_SSL_PROTOCOL``, ``E0425``,
  ``ECONNREFUSED``).

Each value keeps a few words of the sentence it came from (``context``), left out
when they name a secret or hold a URL that may carry one. The scan works on bounded
slices and yields the GIL between them when there are several (it may run in a
worker thread beside the event loop), and reads only the most recent
``MAX_SCANNED`` characters of what it is given.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from proxy.core.value_rules import ID_ONLY, OWNER_OF, RULES

_RULES = RULES  # the one pattern (tests watch the scan call it here)
_ASSISTANT = "assistant"  # the role whose turns state no fact by themselves (salience.py)
_TRAILING = ".,:;!?"
_UNLABELLED = frozenset({"url", "path", "quoted", "id", "code"})
# Values never copied anywhere: credentials are not facts to carry forward, and
# snapshots outlive the conversation that held them.
_SECRET_NAME = re.compile(
    r"pass|secret|token|api[_-]?key|auth|credential|private|signature|session|cookie", re.I
)
# Python's re holds the GIL for a whole call, even in a worker thread: scan in
# short slices (bench/README.md) so the event loop gets its turn between them, and only
# the most recent text of a huge span (older values are likely summarized already).
SLICE_CHARS = 16 * 1024
MAX_SCANNED = 1024 * 1024
# Context: at most this many words either side of a value, within its sentence.
_CONTEXT_WORDS = 5
_CONTEXT_REACH = 80  # characters looked at either side
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)|\n")
_WORD = re.compile(r"\S+")
_SPACE = re.compile(r"\s")


@dataclass(frozen=True, slots=True)
class Value:
    """One value found in text."""

    key: str  # what identifies it: "TCK-90417", "PORT=8080", "SERVER_PORT=7781"
    shown: str  # how it is quoted: "ticket id: TCK-90417", "SERVER_PORT = 7781"
    needles: tuple[str, ...]  # a text that contains all of these has kept it
    labelled: bool = False  # shown with the label it was found under (a key is one)
    kind: str = field(default="", compare=False)  # the rule that found it (salience.py)
    # Where it was found (text, start, end): its context is worked out only if asked
    # for, as most occurrences of a value are superseded by a later one.
    where: tuple[str, int, int] = field(default=("", 0, 0), compare=False, repr=False)
    settled_context: str | None = field(default=None, compare=False, repr=False)

    @property
    def context(self) -> str:
        """A few words of its sentence around it; "" when they say no more than ``shown``."""
        if self.settled_context is not None:
            return self.settled_context
        words = _context(*self.where)
        return "" if words in (self.shown, self.key) else words

    def kept_in(self, text: str) -> bool:
        return all(needle in text for needle in self.needles)

    def settled(self) -> Value:
        """This value with its context worked out, no longer holding the text it was
        found in: to keep, as omitted.py does."""
        return replace(self, where=("", 0, 0), settled_context=self.context)


def find_values(text: str) -> list[Value]:
    """The values in ``text``, each once (by key), in order of last occurrence (most
    recent last); a value seen with a label keeps it where a later mention has none."""
    last: dict[str, Value] = {}
    text = text[-MAX_SCANNED:]
    several = len(text) > SLICE_CHARS
    for piece in _slices(text):
        for match in _RULES.finditer(piece):
            value = _clean(match)
            if value is None:
                continue
            earlier = last.pop(value.key, None)  # re-inserted: dict order is order of use
            last[value.key] = earlier if earlier and not value.labelled else value
        if several:
            time.sleep(0)  # let other threads (the event loop) take the GIL
    return list(last.values())


def values_by_role(
    sources: Iterable[tuple[str, str]], scanned: int = MAX_SCANNED
) -> list[tuple[Value, str, bool]]:
    """Each value of ``sources`` ((role, text) pairs, oldest first) with the role it was
    last seen under and whether a source not the assistant's holds it, in order of last
    occurrence; only the most recent ``scanned`` characters are read."""
    budget = scanned
    recent: list[tuple[str, str]] = []
    for role, text in reversed(list(sources)):
        if budget <= 0:
            break
        recent.append((role, text[-budget:]))
        budget -= len(text)
    last: dict[str, tuple[Value, str, bool]] = {}
    for role, text in reversed(recent):
        for value in find_values(text):
            earlier = last.pop(value.key, None)
            said = role != _ASSISTANT or (earlier is not None and earlier[2])
            if earlier and earlier[0].labelled and not value.labelled:
                value = earlier[0]
            last[value.key] = (value, role, said)
    return list(last.values())


def quoted(text: str) -> str:
    """``text`` as an inline code span no backtick inside it can close."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def quoted_line(role: str, value: Value, *, context: bool) -> str:
    """``- user: `ticket id: TCK-90417` (from `…the ticket id is TCK-90417 for…`)``:
    a value as quoted data, with the role of its message and, if asked and it says
    more, a few words of its sentence."""
    line = f"- {role}: {quoted(value.shown)}"
    if context and value.context:
        line += f" (from {quoted(value.context)})"
    return line


def _slices(text: str) -> Iterator[str]:
    """``text`` cut into pieces of about SLICE_CHARS, at whitespace where there is some."""
    start = 0
    while start < len(text):
        end = min(start + SLICE_CHARS, len(text))
        if end < len(text):
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            end = cut + 1 if cut > start else end
        yield text[start:end]
        start = end


def _clean(match: re.Match[str]) -> Value | None:
    kind = match.lastgroup
    if kind == "labelled" or kind == "named":
        return _labelled(match, kind)
    if kind in ("kv", "spaced", "assign", "colon"):
        return _setting(match, kind)
    value = match.group(0)
    if kind == "quoted":
        value = value[1:-1].strip()
        return _found(match, value, value, (value,)) if len(value) >= 8 else None
    if kind in ("url", "path"):
        value = value.rstrip(_TRAILING)
    if kind == "url":
        public = _public_url(value)
        return None if public is None else _found(match, public, public, (public,))
    if kind == "id" and (
        sum(c.isdigit() for c in value) < 2 or not any(c.isalpha() for c in value)
    ):
        return None  # an id mixes letters and at least two digits
    return _found(match, value, value, (value,)) if value else None


def _labelled(match: re.Match[str], kind: str) -> Value | None:
    """A label, a few linking words and a value: ``port: 8443``."""
    group = match.group
    link: str | None = None  # the words between a label and its value
    if kind == "labelled":
        near = group("lv") is not None  # else some words off (``fv``)
        label = group("ll")
        raw, link = (group("lv"), group("link")) if near else (group("fv"), group("flink"))
    else:
        label, raw = group("nl"), group("nv") or group("nfv")
    if kind == "named":
        start = match.start()
        owner = OWNER_OF.search(match.string, max(0, start - _CONTEXT_REACH), start)
        label = owner.group(1) if owner else label
    name = " ".join(label.lower().replace("_", " ").split())
    if link is not None:
        if name in ID_ONLY:
            return None  # "order 66", "run 3": these say what they label only with "id"
        if name == "due" and link.split()[:1] == ["to"]:
            return None  # "due to 48 retries" gives a reason, not a date
    value = raw.rstrip(_TRAILING)
    if "://" in value:
        value = _public_url(value) or ""
    if not value or (value.isdigit() and len(value) < 2):
        return None  # "build 2 more": one digit is too little to call a value
    return _found(match, value, f"{name}: {value}", (value,))


def _setting(match: re.Match[str], kind: str) -> Value | None:
    """A ``KEY=VALUE``-like match: its key names a setting, never a secret."""
    group = match.group
    if kind == "kv":
        name, value = group("kvk"), group(0).split("=", 1)[1]
        shown_op = "="
    elif kind == "spaced":
        name, value, shown_op = group("sk"), group("sv"), " = "
    elif kind == "assign":
        name, value, shown_op = group("ak"), group("av"), ": "
    else:
        name, value, shown_op = group("ck"), group("cv"), ": "
    value = value.rstrip(_TRAILING)
    if not value or _SECRET_NAME.search(name):
        return None
    shown = f"{name}{shown_op}{value}"
    return _found(match, f"{name}={value}", shown, (name, value))


def _found(match: re.Match[str], key: str, shown: str, needles: tuple[str, ...]) -> Value:
    labelled = match.lastgroup not in _UNLABELLED
    where = (match.string, match.start(), match.end())
    return Value(key, shown, needles, labelled, match.lastgroup or "", where)


def _context(text: str, start: int, end: int) -> str:
    """Up to ``_CONTEXT_WORDS`` words either side of ``text[start:end]``, within its sentence."""
    reach = max(0, start - _CONTEXT_REACH)
    before = text[reach:start]
    stops = list(_SENTENCE_END.finditer(before))
    if stops:
        before = before[stops[-1].end() :]
    elif reach > 0 and not text[reach - 1].isspace():
        before = before[_first_space(before) :]  # a word cut by the reach
    starts = [m.start() for m in _WORD.finditer(before)]
    head = before[starts[-_CONTEXT_WORDS] :] if len(starts) >= _CONTEXT_WORDS else before
    after = text[end : end + _CONTEXT_REACH]
    stop = _SENTENCE_END.search(after)
    after = after[: stop.start()] if stop else after[: _last_space(after)]
    ends = [m.end() for m in _WORD.finditer(after)]
    tail = after[: ends[_CONTEXT_WORDS - 1]] if len(ends) >= _CONTEXT_WORDS else after
    context = " ".join(f"{head}{text[start:end]}{tail}".split())
    if _SECRET_NAME.search(context) or ("://" in context and ("@" in context or "?" in context)):
        # A credential next to the value, or a URL that may carry one: the value
        # (cleaned) is quoted without its neighbours.
        return ""
    return context


def _first_space(text: str) -> int:
    found = _SPACE.search(text)
    return found.start() if found else len(text)


def _last_space(text: str) -> int:
    """Where ``text``'s last whole word ends (all of it when it ends the source)."""
    cut = max(text.rfind(" "), text.rfind("\t"))
    return len(text) if len(text) < _CONTEXT_REACH or cut < 0 else cut


def _public_url(url: str) -> str | None:
    """The URL without credentials: no userinfo, no query when it carries a secret."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query and any(_SECRET_NAME.search(name) for name, _ in parse_qsl(query)):
        query = ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)) or None
