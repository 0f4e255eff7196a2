"""Within step 7 (summarize.py calls it): a span cut into the summarizer calls that fold it.

Each call takes as much of the span as the summarizer's window leaves room for: the
window less the instructions (the longest a call may send: a retry's simple prompt, or
the terser request added to the turns), the answer (``max_tokens``), the framing, the
summary carried in (the previous snapshot's for the first call; for each later one the
last call's answer, at most ``max_tokens``) and a margin for the tokenizer's error, all
counted in the summarizer's tokens. Sized in characters at 3 a token instead, prose of
4-5 characters a token filled about two thirds of a call: a 4k window's first
compaction of ~3.5k tokens took three sequential calls, seconds to tens of seconds each
with a real model (issue 24); now two.

One summary makes at most ``compaction.max_summary_calls`` calls, retries included: a
span needing more chunks than that keeps its newest chunks (a call to spare for a
retry) and the oldest are left out, a deterministic marker in their place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.core.prompts import SIMPLE, TERSER, prompt_for
from proxy.core.tokens import TokenCounter
from proxy.core.transcript import (
    Entry,
    chunk_transcript,
    entry_cost,
    framing_cost,
    render_transcript,
)
from proxy.core.wording import omitted_marker
from proxy.types import ChatMessage

# However small the window, a call summarizes something (a window too small for its
# prompt fails at the upstream, and the turn is trimmed, as before).
_MIN_ROOM = 256
# The proxy's tokenizer is not the summarizer's: its counts are calibrated to the chat
# model's on average, not per text, and not before the tenant's first answers, nor for a
# summarizer_model of its own. A 16th of the window (256 tokens of 4k) to spare.
_MARGIN_SHARE = 16
# Tokenizing more than this runs in a worker thread, as count.py's INLINE_COUNT_BYTES.
_INLINE_CHARS = 32 * 1024
# The chat template around the two messages (system, user) and the reply's start.
_TEMPLATE_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ChunkSize:
    """How much of a span one summarizer call may take."""

    # Most the framed turns and the summary carried in may cost in one call, in ``size``.
    room: int
    carried: int = 0  # most a summary carried from one call into the next costs
    size: Callable[[str], int] = len  # what a text costs: the summarizer's tokens

    @classmethod
    def for_window(cls, window: int, max_tokens: int, counter: TokenCounter) -> ChunkSize:
        """Calls to a summarizer of ``window`` tokens writing at most ``max_tokens``."""
        longest = max(counter.text(prompt_for(max_tokens).system), counter.text(SIMPLE.system))
        terser = counter.text(TERSER.format(limit=max_tokens))
        room = window - max_tokens - longest - terser - _TEMPLATE_TOKENS
        return cls(max(room - window // _MARGIN_SHARE, _MIN_ROOM), max_tokens, counter.text)


async def cut(
    size: ChunkSize, previous: str, span: Sequence[ChatMessage], max_calls: int
) -> tuple[list[list[Entry]], int]:
    """``span`` in chunks, each one call's, folded into ``previous`` in order: at most
    ``max_calls`` of them; and how many of its oldest messages were left out for that."""
    entries = render_transcript(span)
    if sum(len(e.text) for e in entries) > _INLINE_CHARS:  # tokenizing it takes a while
        return await asyncio.to_thread(_cut, size, previous, entries, max_calls)
    return _cut(size, previous, entries, max_calls)


def _cut(
    size: ChunkSize, previous: str, entries: list[Entry], max_calls: int
) -> tuple[list[list[Entry]], int]:
    first = max(size.room - framing_cost(previous, size.size), _MIN_ROOM)
    rest = max(size.room - framing_cost("-", size.size) - size.carried, _MIN_ROOM)
    chunks = chunk_transcript(entries, first, size.size, rest)
    if len(chunks) <= max_calls:
        return chunks, 0
    # The oldest are left out: the newest chunks are kept, and the first of them, which
    # opens with the marker, may be any chunk: each is sized for either place.
    marker = entry_cost(Entry("system", omitted_marker(len(entries))), size.size)
    even = max(min(first, rest) - marker, _MIN_ROOM)
    return _newest_within(chunk_transcript(entries, even, size.size), max_calls)


def _newest_within(chunks: list[list[Entry]], max_calls: int) -> tuple[list[list[Entry]], int]:
    """``chunks`` as one summary may take them within ``max_calls`` calls: all of them,
    or the newest ``max_calls - 1`` (a call to spare for a retry) after a marker entry
    standing for the messages left out; and how many messages were left out."""
    keep = max(max_calls - 1, 1)
    if len(chunks) <= max_calls:
        return chunks, 0
    dropped, kept = chunks[:-keep], chunks[-keep:]
    # A message longer than a chunk continues over several: count where each one starts.
    omitted = sum(entry.part == 1 for chunk in dropped for entry in chunk)
    if kept[0][0].part > 1:
        omitted -= 1  # its start was left out, its rest is kept: not counted whole
    omitted = max(omitted, 1)  # at least part of one message
    # The proxy's own note: only the proxy writes a framed line, so it may say system.
    return [[Entry("system", omitted_marker(omitted)), *kept[0]], *kept[1:]], omitted
