"""Whether a summarizer's answer is a summary at all, before it replaces anything.

A weak model answers with the prompt's own words, an empty template, or a
line for forty messages (issue 21: a 19-token echo of a placeholder was stored
as version 1 and carried into version 2). An answer is rejected, for one reason
of a closed set, when:

* ``empty``: it says nothing;
* ``echo``: a large share of its text repeats the instructions it was given
  (word n-grams of the prompt's guidance, the request's framing, the terser
  request, or the placeholder older versions put in the previous-summary block);
* ``structure``: it lacks most of the headings the prompt asked for;
* ``too_short``: beside its headings and ``none`` lines it is shorter than a floor
  relative to the span it covers and to its budget (never more than ``_FLOOR_CAP``);
* ``truncated``: it was cut off by its token limit (summarize.py's own check);
* ``oversize``: its bytes were far over what its token limit allows, so it was not read
  to its end nor parsed (summarize.py's own check, summary_api.answer_limit).

Identifiers are not judged here: the identifier check restores the ones an
accepted summary lost (fold.py). Pure: text in, a reason or None out.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Literal, get_args

from proxy.core.prompts import TERSER, Prompt

Reason = Literal["empty", "echo", "structure", "too_short", "truncated", "oversize"]
REASONS: tuple[str, ...] = get_args(Reason)

_N = 4  # words per n-gram compared with the instructions
_ECHO_SHARE = 0.35  # of an answer's n-grams found in the instructions: an echo
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
_EMPTY_LINES = frozenset({"", "none", "-", "- none", "n/a", "none.", "nothing"})


def check_summary(text: str, prompt: Prompt, max_tokens: int, span_chars: int) -> Reason | None:
    """Why ``text``, answering ``prompt`` within ``max_tokens`` for a span of
    ``span_chars`` characters, is not a summary to keep; None: it passes."""
    if not text.strip():
        return "empty"
    sections = {s.lower() for s in prompt.sections}
    headings = {h for h in map(_heading, text.splitlines()) if h in sections}
    content = _content(text, sections)
    if _echoes(" ".join(content), prompt):
        return "echo"
    if len(headings) < -(-len(sections) // 2):  # half of them, rounded up
        return "structure"
    floor = min(int(max_tokens * _CHARS_PER_TOKEN * _BUDGET_SHARE), int(span_chars * _SPAN_SHARE))
    if sum(len(line) for line in content) < min(floor, _FLOOR_CAP):
        return "too_short"
    return None


def echoes(text: str, prompt: Prompt) -> bool:
    """Whether ``text`` (a cut-off answer too) mostly repeats the instructions."""
    return _echoes(" ".join(_content(text, {s.lower() for s in prompt.sections})), prompt)


def _content(text: str, sections: set[str]) -> list[str]:
    """``text``'s lines but the asked headings and the empty ones (``none``)."""
    body = [line.strip() for line in text.splitlines() if _heading(line) not in sections]
    return [line for line in body if line.lower() not in _EMPTY_LINES]


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
