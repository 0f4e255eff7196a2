"""Whether a summarizer's answer is a summary at all, before it replaces anything.

A weak model answers with the prompt's own words, an empty template, a copy of
the assistant's own replies, or a line for forty messages (issue 21: a 19-token
echo of a placeholder was stored as version 1 and carried into version 2). An
answer is judged by what it keeps, not by its layout: the headings the prompt
lists are asked for, not required (a summarizer that kept every fact in prose of
its own was rejected for its layout, and the session lost most of them to
trimming). An answer is rejected, for one reason of a closed set, when:

* ``empty``: it says nothing;
* ``echo``: a large share of its text repeats the instructions it was given
  (word n-grams of the prompt's guidance, the request's framing, the terser
  request, or the placeholder older versions put in the previous-summary block);
* ``copied``: a large share of its text is word runs that only the span's
  assistant turns hold (none of its user or tool turns, nor the previous
  summary): the model repeated its own replies instead of summarizing;
* ``too_short``: its content (every line but headings, of any form, and ``none``
  lines) is shorter than a floor relative to the span it covers and to its budget
  (never more than ``_FLOOR_CAP``);
* ``truncated``: it was cut off by its token limit (summarize.py's own check);
* ``oversize``: its bytes were far over what its token limit allows, so it was not read
  to its end nor parsed (summarize.py's own check, summary_api.answer_limit).

An accepted answer without a heading of its own is framed under ``SUMMARY_HEADING``
(``framed``). Identifiers are not judged here: the identifier check restores the
ones an accepted summary lost (fold.py). Pure: text in, a reason or None out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Literal, get_args

from proxy.core.prompts import TERSER, Prompt

Reason = Literal["empty", "echo", "copied", "too_short", "truncated", "oversize"]
REASONS: tuple[str, ...] = get_args(Reason)

_N = 4  # words per n-gram compared with the instructions
_ECHO_SHARE = 0.35  # of an answer's n-grams found in the instructions: an echo
# Of an answer's n-grams found only in the span's assistant turns: a copy of them. A
# summary restates what the assistant did in fewer words and quotes the user's and
# tools' values; even an extractive one of an agent's session, which lifts the
# assistant's own sentences, keeps words of its own. Set high: a summary rejected
# costs the session its summary (trimmed), one kept loses no identifier (restored).
_COPY_SHARE = 0.7
_COPY_MIN_GRAMS = 8  # fewer than this: too little text to call it a copy
# What frames an accepted answer that has no heading of its own (SIMPLE's first section).
SUMMARY_HEADING = "## Summary"
_ASSISTANT = "assistant"
# What older versions put in the previous-summary block on a first compaction.
LEGACY_PLACEHOLDER = "(none: this is the first compaction)"
# What transcript.frame_prompt adds to the quoted turns, without the per-call marker.
_FRAMING = (
    "The quoted text uses the marker. Write the updated handoff summary. previous summary new turns"
)
# Content at least this share of the budget (in characters, about 4 a token) and of the
# span's characters, but a floor of at most _FLOOR_CAP characters: it rejects degenerate
# answers, not terse ones.
_BUDGET_SHARE = 1 / 16
_SPAN_SHARE = 1 / 40
_FLOOR_CAP = 200
_CHARS_PER_TOKEN = 4
_WORD = re.compile(r"[a-z0-9_]+")
_HEADING_MARKS = "#*_ \t"
_NUMBERED = re.compile(r"^\d{1,2}[.)]\s*")
# A line that is a heading whatever its name: ``## Notes``, ``**Notes:**``, ``__Notes__``.
_ANY_HEADING = re.compile(r"#{1,6}[ \t]+\S.*|(\*\*|__)[^*_\n]{1,80}?:?\1:?")
_EMPTY_LINES = frozenset({"", "none", "-", "- none", "n/a", "none.", "nothing"})


def check_summary(
    text: str,
    prompt: Prompt,
    max_tokens: int,
    span_chars: int,
    turns: Iterable[tuple[str, str]] = (),
) -> Reason | None:
    """Why ``text``, answering ``prompt`` within ``max_tokens`` for a span of
    ``span_chars`` characters, is not a summary to keep; None: it passes. ``turns``:
    what the summarizer read, as (role, text) pairs (the previous summary under any
    role but ``assistant``), for the copy check."""
    if not text.strip():
        return "empty"
    sections = {s.lower() for s in prompt.sections}
    content = _content(text, sections)
    joined = " ".join(content)
    if _echoes(joined, prompt):
        return "echo"
    if _copies(joined, turns):
        return "copied"
    floor = min(int(max_tokens * _CHARS_PER_TOKEN * _BUDGET_SHARE), int(span_chars * _SPAN_SHARE))
    if sum(len(line) for line in content) < min(floor, _FLOOR_CAP):
        return "too_short"
    return None


def framed(text: str, prompt: Prompt) -> str:
    """An accepted ``text`` as it is kept: under ``SUMMARY_HEADING`` when none of its
    lines is a heading (a summary in prose of its own), else as it is."""
    sections = {s.lower() for s in prompt.sections}
    if any(_is_heading(line, sections) for line in text.splitlines()):
        return text
    return f"{SUMMARY_HEADING}\n{text.strip()}"


def echoes(text: str, prompt: Prompt) -> bool:
    """Whether ``text`` (a cut-off answer too) mostly repeats the instructions."""
    return _echoes(" ".join(_content(text, {s.lower() for s in prompt.sections})), prompt)


def _content(text: str, sections: set[str]) -> list[str]:
    """``text``'s lines but headings (asked for or not) and the empty ones (``none``)."""
    body = [line.strip() for line in text.splitlines() if not _is_heading(line, sections)]
    return [line for line in body if line.lower() not in _EMPTY_LINES]


def _is_heading(line: str, sections: set[str]) -> bool:
    return _heading(line) in sections or _ANY_HEADING.fullmatch(line.strip()) is not None


def _heading(line: str) -> str:
    """``line`` as a heading's name (``## Goal``, ``**Goal:**``, ``2. Goal:``), lower-case."""
    name = _NUMBERED.sub("", line.strip().strip(_HEADING_MARKS))
    return name.strip(_HEADING_MARKS).rstrip(":*_ \t").lower()


def _echoes(content: str, prompt: Prompt) -> bool:
    grams = _ngrams(content.lower())
    if not grams:
        return False
    echoed = grams & _instruction_ngrams(prompt)
    return len(echoed) >= _ECHO_SHARE * len(grams)


def _copies(content: str, turns: Iterable[tuple[str, str]]) -> bool:
    """Whether most of ``content``'s n-grams are found in assistant turns and in no
    other text the summarizer read."""
    grams = _ngrams(content.lower())
    if len(grams) < _COPY_MIN_GRAMS:
        return False
    theirs: set[tuple[str, ...]] = set()
    others: set[tuple[str, ...]] = set()
    for role, said in turns:
        # Only the answer's own n-grams are collected: a span's are many more.
        found = grams.intersection(_windows(_WORD.findall(said.lower())))
        (theirs if role == _ASSISTANT else others).update(found)
    return len(theirs - others) >= _COPY_SHARE * len(grams)


def _windows(words: Sequence[str]) -> Iterable[tuple[str, ...]]:
    return zip(*(words[i:] for i in range(_N)), strict=False)


def _ngrams(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text)
    if len(words) < _N:
        # A few words only (a placeholder echoed alone): compared whole.
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + _N]) for i in range(len(words) - _N + 1)}


@cache
def _instruction_ngrams(prompt: Prompt) -> frozenset[tuple[str, ...]]:
    """The n-grams of everything the summarizer reads besides the conversation (once per
    prompt), short runs included so a short echo is caught too."""
    source = " ".join((prompt.system, TERSER, _FRAMING, LEGACY_PLACEHOLDER)).lower()
    words = _WORD.findall(source)
    grams = {tuple(words[i : i + _N]) for i in range(len(words) - _N + 1)}
    # Every shorter run too: an answer of fewer than _N words is compared whole.
    for n in range(2, _N):
        grams |= {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
    return frozenset(grams)
