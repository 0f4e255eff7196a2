"""Step 7: ask the upstream for a handoff summary of the turns being compacted.

Incremental: the previous summary plus the newly covered turns go in, one updated
summary comes out. A span larger than the summarizer's own window is folded in chunks,
each updating the summary from the last. Tool calls enter the transcript as names,
brief arguments and brief outcomes, never whole outputs.

The call goes to chat completions, the Responses or the Messages API
(``upstream.summarizer_api``, summary_api.py; the request is summary_request.py's). Where
``compaction.summary_prompt: cached`` allows it (summary_prefix.py), it is instead the
turn's own request cut after the span with the instructions last, in one call: the
provider's prompt cache serves it, and the span is never framed as a transcript.

A summary cut off by its token limit (``finish_reason: length``, or Responses'
``incomplete``) is never kept: its end, where the critical values go, is lost.
It is asked again once, tersely, within the same budget; a second cut-off raises
``SummaryTruncated`` and the caller keeps the previous snapshot. An upstream that refuses
``max_tokens`` as more than the model can write is asked again with the limit it states.

Every answer is checked, in a worker thread, before it is kept (summary_check.py: an
echo of the prompt, a copy of the assistant's replies, too short, empty; its layout is
not judged); one that fails is asked for once more with the simple prompt (prompts.py),
and a second failure raises ``SummaryRejected``: the caller trims and backs off. The
instructions ask for fewer sections when the budget is small. An answer is read only up
to a bound from its ``max_tokens`` (summary_api.answer_limit): past it, it is
``oversize``, unparsed and not asked for again.

Each call takes as much of the span as the summarizer's window leaves room for
(chunking.py). One summary makes at most ``compaction.max_summary_calls`` calls, retries
included, so at most that many times the summarizer's window in tokens: a span needing
more chunks keeps its newest (a call to spare for a retry) and the oldest are left out,
a deterministic marker in their place (in the transcript, and at the head of the new
summary), as trimming does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from proxy.compaction.chunking import cut
from proxy.compaction.summary_api import answer_limit, read_answer, request_body
from proxy.compaction.vetting import echoed, kept, rejection
from proxy.core.ledger import summarizer_cached, summarizer_usage
from proxy.core.prompts import SIMPLE, TERSER, Prompt
from proxy.core.summary_check import Reason
from proxy.core.transcript import (
    Entry,
    frame_prompt,
    framed_marker,
    holds_marker,
    render_transcript,
)
from proxy.core.wording import omitted_marker
from proxy.errors import (
    SummaryError,
    SummaryOversize,
    SummaryRejected,
    SummaryTimedOut,
    SummaryTruncated,
    UpstreamError,
)
from proxy.observe.record import current_record
from proxy.types import ChatMessage
from proxy.upstream.overflow import classify_error

if TYPE_CHECKING:
    from proxy.compaction.summary_request import SummaryRequest

PURPOSE_HEADER = (b"x-compaction-purpose", b"summarize")


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary the model finished, and what it took to get it."""

    text: str
    length_retries: int = 0  # calls retried because the answer was cut off
    calls: int = 0
    omitted: int = 0  # oldest messages of the span left out to stay within max_calls
    rejected: tuple[Reason, ...] = ()  # why answers were not kept (a retry's was)


async def summarize(req: SummaryRequest, previous: str, span: Sequence[ChatMessage]) -> Summary:
    """The updated summary covering ``previous`` plus ``span``; raises SummaryError.

    ``req.timeout_s`` bounds the whole summary, all chunks together: the
    session's lock is held for about that long. Each chunk's answer is checked
    (summary_check.py); one that fails is asked for once more with the simple
    prompt, within ``req.max_calls``, and a second failure fails the summary.
    """
    run = _Run(req)
    text = previous
    if req.cached is None:
        chunks, omitted = await cut(req.chunking, previous, span, req.max_calls)
    else:  # one call: the span is in the prefix the request sends (summary_prefix.py)
        chunks, omitted = [render_transcript(span)], 0
    try:
        async with asyncio.timeout(req.timeout_s):
            for chunk in chunks:
                if run.calls >= req.max_calls:  # retries took the last chunks' calls
                    raise SummaryError(f"summary needs more than {req.max_calls} calls")
                framed = "" if req.cached else frame_prompt(text, chunk)
                text = await run.chunk(framed, text, chunk)
    except TimeoutError as exc:
        failed = SummaryTimedOut("summarizer timed out")
        failed.rejected, failed.calls = tuple(run.rejected), run.calls
        raise failed from exc
    except SummaryError as exc:
        exc.rejected, exc.calls = tuple(run.rejected), run.calls
        raise
    if omitted:
        text = f"{omitted_marker(omitted)}\n\n{text}"
    return Summary(text, run.retries, run.calls, omitted, tuple(run.rejected))


@dataclass(slots=True)
class _Run:
    """One summary's calls so far, its length retries and the reasons answers failed."""

    req: SummaryRequest
    calls: int = 0
    retries: int = 0
    rejected: list[Reason] = field(default_factory=list)

    def _spare(self) -> bool:
        return self.calls + 2 <= self.req.max_calls

    async def chunk(self, framed: str, previous: str, entries: Sequence[Entry]) -> str:
        """The summary ``previous`` updated with one chunk of ``entries``, ``framed``."""
        req = self.req
        span_chars = sum(len(e.text) for e in entries)
        # What the copy check reads: a tool call is the assistant's, but not a reply.
        turns = [("summary", previous), *(("call" if e.call else e.role, e.text) for e in entries)]
        answer = await self._finished(framed)
        # The call's marker is in no quoted text: an answer holding it copied the framing.
        marker = framed_marker(framed)
        copied = answer.finish_reason == "length" or holds_marker(answer.text, marker)
        reason: Reason | None = "echo" if copied else None
        why = partial(rejection, span_chars=span_chars, turns=turns)
        reason = reason or await why(answer.text, req.prompt, answer.max_tokens)
        if reason is None:
            return await kept(answer.text)
        self.rejected.append(reason)
        if self.calls >= req.max_calls:
            raise SummaryRejected(f"summary rejected ({reason}), no call left for a retry")
        # Once more with the simple prompt: a weak model that copies or skips a long
        # template often follows two sections.
        answer = await self._ask(SIMPLE, framed, answer.max_tokens)
        retried: Reason | None = "truncated" if answer.finish_reason == "length" else None
        if retried is None and holds_marker(answer.text, marker):
            retried = "echo"
        retried = retried or await why(answer.text, SIMPLE, answer.max_tokens)
        if retried is not None:
            self.rejected.append(retried)
            raise SummaryRejected(f"summary rejected ({reason}, then {retried} when retried)")
        return await kept(answer.text)

    async def _finished(self, framed: str) -> _Answer:
        """An answer that was not cut off: retried once, tersely, if it was."""
        req = self.req
        answer = await self._ask(req.prompt, framed, req.max_tokens)
        if answer.finish_reason != "length" or await echoed(answer.text, req.prompt):
            # An echo cut off is an echo: asked again with the simple prompt, not tersely.
            return answer
        self.retries += 1
        self.rejected.append("truncated")
        limit = answer.max_tokens
        if self.calls >= req.max_calls:
            raise _cut_off(f"cut off at {limit} tokens, no call left", self.retries)
        terser = f"{framed}\n\n{TERSER.format(limit=limit)}".strip()
        answer = await self._ask(req.prompt, terser, limit)
        if answer.finish_reason == "length":
            self.rejected.append("truncated")
            raise _cut_off(f"cut off at {limit} tokens twice", self.retries)
        return answer

    async def _ask(self, prompt: Prompt, framed: str, max_tokens: int) -> _Answer:
        """One answer, its calls counted; an oversize one is rejected, never retried."""
        try:
            answer = await _call(self.req, prompt, framed, max_tokens, self._spare())
        except SummaryOversize as exc:
            self.calls += exc.posts
            self.rejected.append("oversize")
            raise
        self.calls += answer.posts
        return answer


def _cut_off(what: str, retries: int) -> SummaryTruncated:
    cut = SummaryTruncated(f"summary {what}; keeping the previous one")
    cut.length_retries = retries
    return cut


@dataclass(frozen=True, slots=True)
class _Answer:
    text: str
    finish_reason: str
    max_tokens: int  # what the answer was allowed
    posts: int  # calls it took: 2 when asked again within a stated output limit


async def _call(
    req: SummaryRequest, prompt: Prompt, framed: str, max_tokens: int, spare: bool
) -> _Answer:
    """One answer (empty if the model said nothing); ``spare``: a second call is within
    the budget, if one is needed."""
    status, raw, headers = await _post(req, prompt, framed, max_tokens)
    posts = 1
    if status != 200 and spare:
        verdict = classify_error(status, headers, raw)
        if verdict.kind == "output_budget" and verdict.limit and verdict.limit < max_tokens:
            # The summarizer writes less than configured: ask within what it can.
            max_tokens, posts = verdict.limit, 2
            status, raw, headers = await _post(req, prompt, framed, max_tokens, posts)
    if status != 200:
        raise SummaryError(f"summarizer answered HTTP {status}")
    reading = read_answer(req.api, raw)
    return _Answer(reading.text.strip(), reading.finish_reason, max_tokens, posts)


async def _post(
    req: SummaryRequest, prompt: Prompt, framed: str, max_tokens: int, posts: int = 1
) -> tuple[int, bytes, dict[str, str]]:
    """The status, body and headers of one summary call (the ``posts``-th of its answer).
    A body over what ``max_tokens`` allows (summary_api.answer_limit) is not read past
    that bound: a 200's raises ``SummaryOversize``, an error's reads as empty."""
    allowed = max_tokens  # the answer's tokens, thinking's included
    if req.cached is not None:  # the turn's request, the instructions last
        body, allowed = req.cached.body(prompt, framed, max_tokens)
    else:
        body = request_body(req.api, req.model, prompt.system, framed, max_tokens)
    headers = [
        *req.headers,
        (b"content-type", b"application/json"),
        (b"accept-encoding", b"identity"),  # the body is parsed here
        PURPOSE_HEADER,
    ]
    limit = answer_limit(allowed)
    try:
        response = await req.client.send("POST", req.url, headers, body)
        try:
            raw = await response.aread_at_most(limit)
        finally:
            await response.aclose()
    except UpstreamError as exc:
        raise SummaryError(f"summarizer request failed: {type(exc).__name__}") from exc
    if raw is None:
        if response.status_code == 200:
            oversize = SummaryOversize(f"summary answer over {limit} bytes for {max_tokens} tokens")
            oversize.posts = posts
            raise oversize
        raw = b""
    if response.status_code == 200:  # the ledger's summarizer tokens (core/ledger.py)
        used = summarizer_usage(raw, body)
        current_record().summary_used(req.model, used, summarizer_cached(raw))
    return response.status_code, raw, dict(response.headers)
