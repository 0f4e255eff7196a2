"""Values a summary must not lose, found and restored deterministically.

A model asked to summarize keeps the gist and sometimes drops the one value a
later turn needs: the ticket id, the port, the file path, the exact error. After
every summary the proxy collects the values in what was summarized (the previous
summary and the newly covered turns: ``values.find_values``, labelled values in
prose included) and appends any the new summary no longer contains to a section
of its own, each quoted verbatim with its label and the role of the message it
came from (``- user: `ticket id: TCK-90417```; a value without a label brings a
few words of its sentence: ``- tool: `call_8f3a2c` (from `retry call_8f3a2c
later`)``): a tool's output or a user's text restored there is data, never the
summary's own words nor an instruction, and a system handoff never carries it
(rebuild.py). No model call, no judgement: the same inputs restore the same values.

The carried section is bounded (``max_chars``, and ``max_count`` values,
``compaction.restored_identifiers_max``); when it would overflow, a log's repeated
fields go first, then values used least recently (earliest last occurrence in the
previous summary followed by the new turns), settings and labelled facts last; values
only the assistant's turns held go before all of them (salience.py). A previous
summary's carried lines are carried as they are, role and all, while the new summary
still lacks their values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.core.salience import ASSISTANT, base_tier, heard, keep_order, tiers
from proxy.core.values import MAX_SCANNED, find_values, quoted_line, values_by_role
from proxy.core.wording import CARRIED_HEADING, OMITTED_HEADING, is_quoted_heading

# Summaries stored before restored values were quoted carry this heading.
_LEGACY_HEADING = "## Critical values (carried forward)"
_QUOTED_HEADINGS = (CARRIED_HEADING, OMITTED_HEADING, _LEGACY_HEADING)
# "- tool: `value`" and maybe "(from `words`)": a restored value and its message's role.
_CARRIED_LINE = re.compile(r"(?m)^- ([a-z]+): (`+) ?(.+?) ?\2(?:[ \t].*)?$")
# The role a previous summary's own values are quoted with.
SUMMARY_ROLE = "summary"


@dataclass(frozen=True, slots=True)
class Restored:
    """The summary to keep, and how many identifiers had to be put back into it."""

    summary: str
    restored: int
    dropped: int  # lost by the model and not restored: the section's bound was hit


@dataclass(frozen=True, slots=True)
class _Wanted:
    """A value to keep: its line in the carried section and what shows it is kept."""

    line: str
    keys: frozenset[str]
    needles: tuple[tuple[str, ...], ...]  # kept when every one of these is all present
    tier: int  # kept before higher tiers when the section is full (salience.py)

    def kept_in(self, text: str) -> bool:
        return all(all(n in text for n in needles) for needles in self.needles)


def restore_identifiers(
    summary: str, sources: Iterable[tuple[str, str]], max_chars: int, max_count: int = 64
) -> Restored:
    """``summary`` with the values of ``sources`` that it lost appended, bounded.

    ``sources`` is what was summarized, oldest first, as (role, text) pairs: the
    previous summary (role ``summary``), then each newly covered message with its
    role. Lost values are restored as quoted data, each with the role of the message
    it was last seen in, under one section at the end (``CARRIED_HEADING``): a copy of
    that section the model wrote into its summary is dropped and rebuilt, so sections
    never nest and no restored line is ever the model's (or a tool's) unlabelled text.
    At most ``max_count`` values and ``max_chars`` characters are restored.
    """
    body = strip_carried(summary.strip())
    missing = [w for w in _wanted(list(sources)) if not w.kept_in(body)]
    if not missing:
        return Restored(body, 0, 0)
    chosen: list[int] = []
    size = len(CARRIED_HEADING) + 2
    # Settings and labelled facts first, log fields last, most recently used first
    # within each (salience.py): the bounds drop log noise and the least recently used.
    for i in keep_order([wanted.tier for wanted in missing]):
        line = missing[i].line
        if size + len(line) + 1 > max_chars or len(chosen) >= max_count:
            continue
        chosen.append(i)
        size += len(line) + 1
    if not chosen:
        return Restored(body, 0, len(missing))
    kept = [missing[i].line for i in sorted(chosen)]
    lines = "\n".join(kept)
    return Restored(f"{body}\n\n{CARRIED_HEADING}\n{lines}", len(kept), len(missing) - len(kept))


def _wanted(sources: list[tuple[str, str]]) -> list[_Wanted]:
    """What ``sources`` hold, in order of last use: a previous summary's carried lines
    as they are, then the values of its text and of the new messages, by role."""
    carried: list[_Wanted] = []
    texts: list[tuple[str, str]] = []
    for role, text in sources:
        if role == SUMMARY_ROLE:
            written, section = split_carried(text)
            carried += _carried_lines(section)
            text = written
        texts.append((role, text))
    found = values_by_role(texts, MAX_SCANNED)
    fresh = {value.key for value, _, _ in found}
    wanted = [w for w in carried if not w.keys & fresh]  # a newer mention supersedes it
    ranks = heard(tiers([value for value, _, _ in found]), [said for _, _, said in found])
    for (value, role, _), tier in zip(found, ranks, strict=True):
        line = quoted_line(role, value, context=not value.labelled)
        wanted.append(_Wanted(line, frozenset({value.key}), (value.needles,), tier))
    return wanted


def _carried_lines(section: str) -> list[_Wanted]:
    """Each quoted line of a previous summary's carried section, to carry as it is."""
    out = []
    for m in _CARRIED_LINE.finditer(section):
        values = find_values(m.group(3))
        keys = frozenset(v.key for v in values) or frozenset({m.group(3)})
        needles = tuple(v.needles for v in values) or ((m.group(3),),)
        tier = heard([min(map(base_tier, values), default=1)], [m.group(1) != ASSISTANT])[0]
        out.append(_Wanted(m.group(0).rstrip(), keys, needles, tier))
    return out


def carried_start(text: str) -> int | None:
    """Where ``text``'s first quoted section (carried, omitted or legacy heading) starts."""
    at = 0
    for line in text.split("\n"):
        if is_quoted_heading(line, _QUOTED_HEADINGS):
            return at
        at += len(line) + 1
    return None


def strip_carried(summary: str) -> str:
    """``summary`` without its carried sections (a model may copy the previous one)."""
    sections = re.split(r"(?m)^(?=## )", summary)
    kept = [s for s in sections if not is_quoted_heading(s.split("\n", 1)[0], _QUOTED_HEADINGS)]
    return "".join(kept).strip()


def split_carried(summary: str) -> tuple[str, str]:
    """The model's summary, and the restored identifiers' section that follows it ("" if
    none): the handoff keeps quoted values out of a system message (rebuild.py)."""
    at = carried_start(summary)
    if at is None:
        return summary, ""
    return summary[:at].strip(), summary[at:].strip()
