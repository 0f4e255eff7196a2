"""Vetting a summarizer's answer (summarize.py asks, core/summary_check.py and
core/neutral.py judge), always in a worker thread.

The checks cost time in proportion to the answer, and the event loop serves every
tenant: an answer at the bound (summary_api.answer_limit) takes tens of milliseconds
to check on a loaded machine, far more than a thread hop, and a summary call is rare
and slow anyway, so no answer is vetted on the loop. The bound keeps the thread's work
bounded too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.core.neutral import neutralised
from proxy.core.prompts import Prompt
from proxy.core.summary_check import Reason, check_summary, echoes


async def rejection(
    text: str,
    prompt: Prompt,
    max_tokens: int,
    span_chars: int,
    turns: Sequence[tuple[str, str]] = (),
) -> Reason | None:
    """Why ``text`` is not a summary to keep (summary_check.check_summary); None: it is."""
    return await asyncio.to_thread(check_summary, text, prompt, max_tokens, span_chars, turns)


async def echoed(text: str, prompt: Prompt) -> bool:
    """Whether ``text`` mostly repeats the instructions (a cut-off answer too)."""
    return await asyncio.to_thread(echoes, text, prompt)


async def kept(text: str) -> str:
    """An accepted answer as the summary keeps it: nothing in it imitates the proxy's
    marks (neutral.py), so it cannot close its frame and speak as the proxy."""
    return await asyncio.to_thread(neutralised, text)
