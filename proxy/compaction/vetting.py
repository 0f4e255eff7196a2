"""Vetting a summarizer's answer (summarize.py asks, core/summary_check.py and
core/neutral.py judge), off the event loop when the answer is long.

The checks cost time in proportion to the answer (the copy check also to the span it
covers), and the event loop serves every tenant: an answer or span longer than
``_INLINE_CHARS`` is vetted in a worker thread. The answer's length is bounded before
this (summary_api.answer_limit), and the span's by the summarizer's window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from proxy.core.neutral import neutralised
from proxy.core.prompts import Prompt
from proxy.core.summary_check import Reason, check_summary, echoes

P = ParamSpec("P")
T = TypeVar("T")

# Characters of an answer vetted on the loop at most (count.py's INLINE_COUNT_BYTES, the
# same judgement for counting: a few milliseconds).
_INLINE_CHARS = 32 * 1024


async def rejection(
    text: str,
    prompt: Prompt,
    max_tokens: int,
    span_chars: int,
    turns: Sequence[tuple[str, str]] = (),
) -> Reason | None:
    """Why ``text`` is not a summary to keep (summary_check.check_summary); None: it is.
    The copy check reads the span's words too, so a long span also moves it off the loop."""
    size = max(len(text), span_chars)
    return await _off_loop(size, check_summary, text, prompt, max_tokens, span_chars, turns)


async def echoed(text: str, prompt: Prompt) -> bool:
    """Whether ``text`` mostly repeats the instructions (a cut-off answer too)."""
    return await _off_loop(len(text), echoes, text, prompt)


async def kept(text: str) -> str:
    """An accepted answer as the summary keeps it: nothing in it imitates the proxy's
    marks (neutral.py), so it cannot close its frame and speak as the proxy."""
    return await _off_loop(len(text), neutralised, text)


async def _off_loop(size: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    if size > _INLINE_CHARS:
        return await asyncio.to_thread(work, *args, **kwargs)
    return work(*args, **kwargs)
