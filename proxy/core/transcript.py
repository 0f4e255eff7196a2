"""What the summarizer reads: a span of the conversation as text, one entry per
message, tool calls as names and brief arguments, tool outputs shortened; that
text cut into chunks that each fit one summary call; and each chunk framed for
the prompt.

The framing cannot be forged from inside the conversation: every call gets a
fresh random boundary that no quoted text contains, and only a line carrying it
opens or closes a block or a message, with the message's role in that line. A
message that says ``</new_turns>`` or ``[system] ...`` is just that message's
text (issue 20).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.types import UNSEEN_ITEM, ChatMessage

_ARG_CHARS = 300
_RESULT_CHARS = 800
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_NAME_CHARS = 64
# A boundary is 8 hex digits, drawn per call after the quoted text is known and drawn
# again if any of it contains the boundary: no text can carry it, however short it is.
# It opens every message, so its length is paid per message. Chunks are sized with a
# stand-in as costly as any boundary: 8 characters, and in tokens a letter and a digit
# in turn, which BPE vocabularies split one token a character (a real boundary
# costs at most that), or a chunk of many short messages overflows the summarizer's
# window (tests/e2e/test_scale.py).
_STAND_IN = "a0b1c2d3"
_NAME_UNSAFE = re.compile(r"[^\w.-]")


@dataclass(frozen=True, slots=True)
class Entry:
    """One framed piece of the transcript: a message's text, or a tool call it makes."""

    role: str  # one of _ROLES, or "unknown"
    text: str
    tool: str = ""  # a result's tool, or the tool a call names
    call: bool = False  # an assistant's tool call rather than a message
    part: int = 1  # a message longer than a chunk continues over several parts

    def framed(self, boundary: str) -> str:
        """The entry as the prompt quotes it: a line with the boundary and its role (and
        tool), then its text, which runs to the next such line. A header per message and
        no closing line: framing costs the summarizer's window a few tokens a message."""
        label = self.role
        if self.tool:
            label += f" calls {self.tool}" if self.call else f" {self.tool}"
        if self.part > 1:
            label += f", part {self.part}"
        return f"[{boundary} {label}]\n{self.text}"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                elif part.get("type") == "image_url":
                    parts.append("[image]")
                elif part.get("type") == UNSEEN_ITEM:  # a Responses item_reference
                    parts.append(f"[an earlier output not seen: {_name(part.get('id'))}]")
        return "\n".join(parts)
    return ""


def _role(message: ChatMessage) -> str:
    role = message.get("role")
    return role if isinstance(role, str) and role in _ROLES else "unknown"


def _name(value: Any) -> str:
    """A client-chosen tool name as the framing line shows it: it cannot end that line."""
    return _NAME_UNSAFE.sub("_", str(value)[:_NAME_CHARS])


def _brief(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more chars]"


def render_transcript(messages: Sequence[ChatMessage]) -> list[Entry]:
    """One entry per message, then one per tool call it makes; tool outputs shortened,
    tool calls as name(args)."""
    names: dict[str, str] = {}
    entries: list[Entry] = []
    for m in messages:
        role = _role(m)
        text = _text(m.get("content"))
        if role == "tool":
            name = names.get(str(m.get("tool_call_id", "")), "tool")
            entries.append(Entry(role, _brief(text, _RESULT_CHARS), tool=name))
            continue
        calls = m.get("tool_calls") or ()
        if text or not calls:
            entries.append(Entry(role, text))
        for call in calls:
            fn = call.get("function") or {}
            name = _name(fn.get("name", "tool"))
            names[str(call.get("id", ""))] = name
            args = _brief(str(fn.get("arguments", "")), _ARG_CHARS)
            entries.append(Entry(role, f"{name}({args})", tool=name, call=True))
    return entries


def new_boundary(texts: Sequence[str]) -> str:
    """A random boundary none of ``texts`` contains (a clash is drawn again)."""
    while True:
        boundary = secrets.token_hex(4)
        if not any(boundary in text for text in texts):
            return boundary


def frame_prompt(previous: str, entries: Sequence[Entry]) -> str:
    """The summarizer's prompt for one chunk: the previous summary, if any, and the new
    turns, framed with a boundary of this call's own. The instructions (prompts.py) say
    how the framing reads; the request only names its marker: a small model copied a
    preamble explaining it. A first compaction has no previous-summary block at all: a
    placeholder there is text a weak model copied into its summary (issue 21)."""
    b = new_boundary([previous, *(e.text for e in entries)])
    return _framed(b, previous, "\n".join(e.framed(b) for e in entries))


def framing_cost(previous: str, size: Callable[[str], int] = len) -> int:
    """What ``frame_prompt`` adds to the turns it frames, ``previous`` included, in units
    of ``size``, at the most any boundary costs."""
    return size(_framed(_STAND_IN, previous, ""))


def _framed(b: str, previous: str, turns: str) -> str:
    prev = f"<previous_summary_{b}>\n{previous}\n</previous_summary_{b}>\n\n" if previous else ""
    return (
        f"The quoted text uses the marker {b}.\n\n"
        f"{prev}<new_turns_{b}>\n{turns}\n</new_turns_{b}>\n\n"
        f"Write the {'updated ' if previous else ''}handoff summary."
    )


def framed_marker(framed: str) -> str:
    """The marker ``frame_prompt`` drew for ``framed``; "" for other text. It is in none of
    the quoted texts, so an answer that holds it copied the framing (issue 21: a 0.5B
    model wrote "the conversation between tags that carry a marker 05563640" under three
    headings, and that summary was stored)."""
    head = "The quoted text uses the marker "
    if not framed.startswith(head):
        return ""
    return framed[len(head) :].split(".", 1)[0]


def holds_marker(answer: str, marker: str) -> bool:
    """Whether ``answer`` holds ``marker`` (``framed_marker``'s, "" for none): it copied
    the framing."""
    return bool(marker) and marker in answer


def span_sources(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """Everything a span says, whole (tool outputs and call arguments included), as
    (role, text) per message, for the identifier check: the transcript the summarizer
    sees shortens those, and a restored value is quoted with the role it came from."""
    out: list[tuple[str, str]] = []
    for m in messages:
        parts = [_text(m.get("content"))]
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
        out.append((_role(m), "\n".join(parts)))
    return out


def chunk_transcript(
    entries: list[Entry], first: int, size: Callable[[str], int] = len, rest: int | None = None
) -> list[list[Entry]]:
    """``entries`` in order, in chunks of at most ``first`` (the first chunk) or ``rest``
    (each later one; ``first`` if not given) framed units of ``size``: characters, or the
    summarizer's tokens. A longer entry continues over several, each part within both."""
    rest = first if rest is None else rest
    chunks: list[list[Entry]] = [[]]
    used = 0
    for entry in _split_long(entries, min(first, rest), size):
        cost = entry_cost(entry, size)
        if chunks[-1] and used + cost > (rest if len(chunks) > 1 else first):
            chunks.append([])
            used = 0
        chunks[-1].append(entry)
        used += cost
    return chunks


def entry_cost(entry: Entry, size: Callable[[str], int] = len) -> int:
    """What ``entry`` costs a chunk, in units of ``size``, at the most any boundary costs:
    its framed text and the line break joining it to the next."""
    return size(entry.framed(_STAND_IN)) + 1


def _split_long(entries: list[Entry], limit: int, size: Callable[[str], int]) -> list[Entry]:
    """A message longer than a chunk continues over several, losing nothing."""
    out: list[Entry] = []
    for entry in entries:
        # Its framing as a part's: a ", part n" in its header line, and the line break.
        frame = size(Entry(entry.role, "", entry.tool, entry.call, 99999).framed(_STAND_IN)) + 2
        whole = size(entry.text)
        if whole + frame <= limit:
            out.append(entry)
            continue
        parts = _pieces(entry.text, whole, max(limit - frame, 1), size)
        out.extend(Entry(entry.role, p, entry.tool, entry.call, i + 1) for i, p in enumerate(parts))
    return out


def _pieces(text: str, whole: int, room: int, size: Callable[[str], int]) -> list[str]:
    """``text`` cut into consecutive pieces of at most ``room`` units of ``size`` each
    (``whole``: all of it), cut at character offsets: text denser than the average in
    some part is cut again with smaller steps."""
    step = max(len(text) * room // max(whole, 1), 1)
    while True:
        parts = [text[i : i + step] for i in range(0, len(text), step)]
        worst = max(size(p) for p in parts)
        if worst <= room or step == 1:
            return parts
        step = max(min(step * room // worst, step - 1), 1)
