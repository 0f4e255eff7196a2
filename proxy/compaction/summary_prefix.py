"""Within step 7: the summary asked as the conversation's own request, so the provider's
prompt cache serves it (``compaction.summary_prompt: cached``).

The span a compaction summarizes is the oldest turns after the pinned messages and the
handoff of the summary so far: what the last request sent up to the cut is a prefix of
it, and a provider that caches prompts (OpenAI's automatic caching, Anthropic's
``cache_control``) has that prefix cached. So the summary call sends the turn's own
request in its own API (``Api.summary_body``: the same system prompt, tools and tool
choice) with the view the session is served (``sent_prefix``: pinned messages, the
current handoff, the turns up to the cut, elisions as sent) and the summary instruction
(prompts.py ``Prompt.cached``) as a final user turn. The previous summary is in the
prefix already, as its handoff; the new one replaces it.

It is asked so only where the prefix can have been sent and cached: the span starts
where the session's current view starts its tail (else the proxy's view was not that
prefix), the summarizer is the turn's own model (caches are per model), the turn's API
has a summary shape (routes/summary_bodies.py: not when a tool is forced), and the
prefix, the longest instruction and the answer (thinking's budget too) fit the model's
window with the chunking's margin (summary_request.py's ``cached_ask`` judges). Otherwise
the transcript is summarized as before, in chunks if need be (chunking.py). The checks
of an answer are the same either way (summarize.py): an echo of the instructions, a copy
of the assistant's turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.config import CompactionSettings
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.types import ChatMessage

if TYPE_CHECKING:
    from proxy.compaction.job import Job
    from proxy.core.snapshot import Loaded


@dataclass(frozen=True, slots=True)
class Prefix:
    """What the session's view sends up to a cut: its messages and their tokens (the
    proxy's count: pinned, the handoff, the span and the fixed part, tools included)."""

    messages: list[ChatMessage]
    tokens: int


def sent_prefix(
    job: Job, loaded: Loaded, span: tuple[int, int], c: CompactionSettings
) -> Prefix | None:
    """The view ``loaded`` serves ``job``'s history, up to the end of ``span``; None when
    the summary is not asked so (``summary_prompt``: ``c``'s, or the turn's tenant's), or
    the span does not start where that view's tail does."""
    c = job.turn.compaction(c)  # its tenant's policy's
    if c.summary_prompt != "cached":
        return None
    h, (start, end) = job.history, span
    current = loaded.view(h.pinned)
    if start != current.covered or not h.pinned <= start < end <= len(h.messages):
        return None
    shown = rebuild_outcome(h, current, Handoff.of(loaded, c.summary_role), job.budget).messages
    messages = list(h.messages) if shown is None else shown
    counts = h.counts
    tokens = sum(counts[: h.pinned]) + job.budget.fixed + sum(counts[start:end])
    if current.covered > h.pinned:
        tokens += current.summary_tokens
    return Prefix(messages[: len(messages) - (len(h.messages) - end)], tokens)
