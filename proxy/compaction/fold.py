"""Within step 7 (compact.py calls it, summarize.py calls the upstream): fold a span of the
history into the session's summary.

The upstream writes the new summary (summarize.py), which checks each answer
(summary_check.py: rejected ones are counted and logged here; one with no heading of
its own is framed under the proxy's); what it dropped of the identifiers in the
previous summary and the span is put back (identifiers.py); the result is counted as
the upstream will see it. A summary counted far over its budget is not kept. The
caller decides what a failure means for the turn (compact.py trims instead).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.compaction.count import INLINE_COUNT_BYTES, count_text
from proxy.compaction.pace import SummaryPace
from proxy.compaction.summarize import summarize
from proxy.compaction.summary_request import SummaryRequest
from proxy.config import Settings
from proxy.core.budget import FRAME_TOKENS, MIN_SUMMARY_TOKENS, summary_limit
from proxy.core.identifiers import (
    SUMMARY_ROLE,
    Restored,
    restore_identifiers,
    split_carried,
    strip_carried,
)
from proxy.core.models import ModelTable, ResolvedModel
from proxy.core.outcome import Turn
from proxy.core.session import SessionKey
from proxy.core.summary_check import framed
from proxy.core.tokens import TokenCounter
from proxy.core.transcript import span_sources
from proxy.core.wording import ACKNOWLEDGEMENT, QUOTED_INTRO, handoff_text
from proxy.errors import SummaryError, SummaryTimedOut, SummaryTooSlow, SummaryTruncated
from proxy.observe.metrics import Metrics
from proxy.observe.record import current_record
from proxy.types import ChatMessage
from proxy.upstream.seam import Upstream

if TYPE_CHECKING:
    from proxy.compaction.job import Job
    from proxy.compaction.summary_prefix import Prefix

log = logging.getLogger("proxy.compaction")

# A summary counted at more than this many times its budget is not kept: no model that
# honours max_tokens writes it, whatever the difference between tokenizers.
_MAX_OVERRUN = 2


@dataclass(slots=True)
class SummaryWatch:
    """Whether a compaction got as far as asking for its summary, and what that took:
    for the caller that sets one in ``SUMMARY_WATCH`` around it (turn_deadline.py), which
    tells its turn's own summary from a wait for another request's."""

    started: bool = False
    seconds: float | None = None  # once it ended, succeeded or not
    max_tokens: int = 0  # what it was allowed to write (pace.py sizes it)
    ended: Callable[[], None] | None = None  # told once its calls are over (busy.Lease)


# Per task: a compaction started with one set reports to it (fold is the one place that
# knows a summary is being asked for).
SUMMARY_WATCH: ContextVar[SummaryWatch | None] = ContextVar("summary_watch", default=None)


@dataclass(frozen=True, slots=True)
class Folded:
    """A new summary to keep."""

    summary: str
    tokens: int  # what it costs in a view, its framing included
    restored: int  # identifiers it had lost and that were put back


@dataclass(frozen=True, slots=True)
class Folder:
    """Asks for summaries and vets them; one per app (the compactor's)."""

    settings: Settings
    models: ModelTable
    client: Upstream  # summaries are asked of the upstream through it
    counters: dict[str, TokenCounter]
    metrics: Metrics
    pace: SummaryPace  # what the summarizer's summaries take: they are sized by it

    async def fold(
        self,
        job: Job,
        previous: str,
        span: Sequence[ChatMessage],
        prefix: Prefix | None = None,
    ) -> Folded | None:
        """``previous`` updated with ``span`` for ``job``, or None when the new summary is
        far over its budget (logged and counted here). Raises the summarizer's
        ``SummaryError``. ``prefix``: what the session's view sent up to the span's end
        (summary_prefix.py), for a summary asked after it; None: a transcript's."""
        turn, key, background = job.turn, job.key, job.background
        request = (
            SummaryRequest.for_turn(turn, self.settings, self.models, self.client, self.counters)
            .within(self._cap(job))
            .after(turn, prefix, self.settings.upstream.base_url)
        )
        started, record = time.perf_counter(), current_record()
        written = record.summarized[1]
        watch = SUMMARY_WATCH.get()
        if watch is not None:
            watch.started, watch.max_tokens = True, request.max_tokens
        if not background:
            self.metrics.summary_waits.labels(kind="summarized").inc()
        try:
            made = await summarize(request, previous, span)
        except SummaryError as exc:
            elapsed = self._timed(turn, started, "failed")
            if isinstance(exc, SummaryTimedOut):
                self.pace.ran_out(key.tenant, request.model, elapsed, request.max_tokens)
            self._rejected(key, exc.rejected)
            self.metrics.summary_failures.inc()
            if isinstance(exc, SummaryTruncated):
                self.metrics.summaries_truncated.inc()
                self.metrics.summary_length_retries.inc(exc.length_retries)
            raise
        elapsed = self._timed(turn, started, "ok")
        # The output tokens it wrote, while the request's record still counts them.
        tokens = None if record.finished else record.summarized[1] - written
        self.pace.finished(key.tenant, request.model, elapsed, tokens or None)
        self.metrics.summarizer_calls.observe(made.calls)
        self._rejected(key, made.rejected)
        if made.omitted:
            log.warning(
                "session=%s span needs more than %d summarizer calls: its %d oldest messages "
                "left out of the summary, marked",
                key.log_id,
                request.max_calls,
                made.omitted,
            )
        if made.length_retries:
            self.metrics.summary_length_retries.inc(made.length_retries)
        limit = summary_limit(turn.model, turn.compaction(self.settings.compaction))
        most = self.settings.compaction.restored_identifiers_max
        # A summary in prose of its own is kept under the proxy's heading (summary_check.py),
        # judged without a quoted section it copied (restoring drops and rebuilds those).
        summary = framed(strip_carried(made.text), request.prompt)
        kept = await _restore(summary, previous, span, limit, most)
        if kept.restored:
            self.metrics.identifiers_restored.inc(kept.restored)
        counter = self.counters[turn.model.tokenizer]
        text = handoff_text(kept.summary)
        if self.settings.compaction.summary_role == "system" and split_carried(kept.summary)[1]:
            # Quoted identifiers then follow the system handoff as a user turn and its
            # acknowledgement (rebuild.py): count what they add.
            text = f"{text}\n{QUOTED_INTRO}\n{ACKNOWLEDGEMENT}"
        tokens = await count_text(counter, text)
        if tokens > _MAX_OVERRUN * limit:
            # The summarizer ignored max_tokens. Kept, such a summary could overflow the
            # window, and would be over the trigger again, and summarized, every turn.
            self.metrics.summary_failures.inc()
            log.warning(
                "session=%s summary of %d tokens is far over its budget of %d; trimming instead",
                key.log_id,
                tokens,
                limit,
            )
            return None
        return Folded(kept.summary, tokens + FRAME_TOKENS, kept.restored)

    def _rejected(self, key: SessionKey, reasons: Sequence[str]) -> None:
        """Count (and log, without content) the answers of a summary that were not kept."""
        if not reasons:
            return
        for reason in reasons:
            self.metrics.summaries_rejected.labels(reason=reason).inc()
        log.warning("session=%s summarizer answers rejected: %s", key.log_id, ", ".join(reasons))

    def summarizer(self, turn: Turn) -> ResolvedModel:
        """The model ``turn``'s summaries are asked of (``compaction.summarizer_model``)."""
        c = turn.compaction(self.settings.compaction)
        return self.models.resolve(c.summarizer_model) if c.summarizer_model else turn.model

    def _cap(self, job: Job) -> int | None:
        """The most tokens ``job``'s summarizer is known to write in the time its summary
        has (None: not known): the turn's deadline where a summary past it is dropped (a
        model without background summaries, or on one slot), else ``summary_timeout_s``. Raises
        ``SummaryTooSlow`` when not even the shortest summary would finish."""
        turn = job.turn
        c = turn.compaction(self.settings.compaction)
        inline = not job.background and not turn.model.keeps_late_summaries
        allowed = c.summary_deadline_s if inline and c.summary_deadline_s else c.summary_timeout_s
        cap = self.pace.affordable(job.key.tenant, self.summarizer(turn).name, allowed)
        if cap is not None and cap < MIN_SUMMARY_TOKENS:
            self.metrics.summary_failures.inc()
            raise SummaryTooSlow(f"the summarizer writes about {cap} tokens in {allowed:g} s")
        return cap

    def _timed(self, turn: Turn, started: float, outcome: str) -> float:
        elapsed = time.perf_counter() - started
        self.metrics.summarization_duration.labels(outcome=outcome).observe(elapsed)
        current_record().summary_s = elapsed
        watch = SUMMARY_WATCH.get()
        if watch is not None:
            watch.seconds = elapsed
            if watch.ended is not None:
                watch.ended()
        return elapsed


async def _restore(
    summary: str, previous: str, span: Sequence[ChatMessage], max_chars: int, max_count: int
) -> Restored:
    """``summary`` with the identifiers it lost from ``previous`` and ``span`` put back."""
    sources = [(SUMMARY_ROLE, previous), *span_sources(span)]
    # The summary is searched for each value: its length counts too.
    if len(summary) + sum(len(text) for _, text in sources) > INLINE_COUNT_BYTES:
        return await asyncio.to_thread(restore_identifiers, summary, sources, max_chars, max_count)
    return restore_identifiers(summary, sources, max_chars, max_count)
