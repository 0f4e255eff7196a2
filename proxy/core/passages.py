"""The originals of a span, as the archive keeps them and the recall index reads them.

A span the proxy summarizes or elides is archived message by message, verbatim: its
role, its text, the tool calls it makes (name and arguments) and, for a tool result,
the tool it answers (``archived_messages``). The index searches them in passages of a
bounded size (``split_passages``): a long tool output is many passages, each of which
an excerpt can quote alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.core.transcript import span_sources
from proxy.types import ChatMessage

# About 100 tokens of English: one fact and its context, small enough that a few fit a
# recall budget of a 4k window, large enough that a sentence is rarely cut in two.
PASSAGE_CHARS = 480


@dataclass(frozen=True, slots=True)
class Original:
    """One archived message: where it stood in the history, its role and every word of
    it (tool calls as ``name arguments`` lines, a result under its tool's name)."""

    position: int
    role: str
    text: str
    tool: str = ""
    digest: str = ""  # the message's digest in its history (hex): is it still there?


@dataclass(frozen=True, slots=True)
class Passage:
    """A searchable piece of an ``Original``: its text verbatim, and its size."""

    position: int
    role: str
    tool: str
    text: str
    part: int  # 0 for the first piece of the message
    tokens: int
    digest: str = ""  # its message's (Original.digest)


def archived_messages(
    messages: Sequence[ChatMessage], positions: Sequence[int], digests: Sequence[bytes] = ()
) -> list[Original]:
    """The originals of ``messages`` (which stood at ``positions`` of the history, with
    those ``digests``, if given)."""
    sources = span_sources(messages)
    names: dict[str, str] = {}
    out: list[Original] = []
    for message, (role, text), position in zip(messages, sources, positions, strict=True):
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            names[str(call.get("id", ""))] = str(fn.get("name", ""))
        tool = names.get(str(message.get("tool_call_id", "")), "") if role == "tool" else ""
        digest = digests[len(out)].hex() if digests else ""
        out.append(Original(position, role, text, tool[:64], digest))
    return out


def split_passages(
    original: Original, size: int = PASSAGE_CHARS, count: Callable[[str], int] | None = None
) -> list[Passage]:
    """``original``'s text in consecutive pieces of at most about ``size`` characters, cut
    at a line or a sentence end, else a space, where one is near; nothing is lost. Each
    sized by ``count`` (tokens), or estimated at four characters a token."""
    text = original.text.strip()
    if not text:
        return []
    pieces: list[str] = []
    start = 0
    while len(text) - start > size:
        end = _cut(text, start, start + size)
        pieces.append(text[start:end].strip())
        start = end
    pieces.append(text[start:].strip())
    size_of = count or _tokens
    o = original
    return [
        Passage(o.position, o.role, o.tool, piece, i, size_of(piece), o.digest)
        for i, piece in enumerate(p for p in pieces if p)
    ]


def _cut(text: str, start: int, end: int) -> int:
    """Where to end the piece ``text[start:end]``: after the last line break, sentence end
    or space in its second half, else at ``end``."""
    half = start + (end - start) // 2
    for mark in ("\n", ". ", " "):
        at = text.rfind(mark, half, end)
        if at >= 0:
            return at + len(mark)
    return end


def _tokens(text: str) -> int:
    # Without a tokenizer: ~4 characters a token for English, rounded up.
    return len(text) // 4 + 1
