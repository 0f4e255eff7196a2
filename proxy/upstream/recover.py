"""Step 10: the upstream said the request is too long. Trim, retry once, learn.

Runs only before any event reached the client (a stream's comments may have:
stream_head.py): an error answer is a small JSON (or HTML) body, read whole
here and classified. Anything that is not a
context or output-budget problem goes back to the client unchanged. For an
overflow, the stated limit (converted to the proxy's token units) becomes
the model's learned window and the request is compacted again against it;
for an output budget, ``max_tokens`` is lowered to what the model allows.
Either way the request is retried exactly once, and a second failure is
returned to the client as the upstream wrote it (in a stream already under way,
as one error event). ``pipeline.recover_overflow``
runs these pieces in order: diagnose, learn (or lower), compact again, retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from starlette.responses import Response

from proxy.core.models import ModelTable
from proxy.core.outcome import Turn
from proxy.core.tokens import output_reserve
from proxy.errors import ContextTooLarge
from proxy.observe.metrics import Metrics
from proxy.upstream import client as upstream
from proxy.upstream.api import Attempt, Route
from proxy.upstream.overflow import Overflow, classify_error, echoed, mentions, request_text
from proxy.upstream.relay import buffered, relay
from proxy.upstream.seam import Upstream
from proxy.upstream.stream_head import (
    MAX_HEAD_BYTES,
    Held,
    comments_ahead,
    first_event,
)
from proxy.upstream.windows import MIN_WINDOW, LearnedWindows

log = logging.getLogger("proxy.recover")

# Statuses an overflow can come back with (overflow.py has the rules).
RECOVERABLE = frozenset({400, 413, 422, 500, 503})
# Error bodies are small; a bigger one is not an error we can classify.
_MAX_ERROR_BYTES = 256 * 1024
# Aim below the stated limit: counts differ between tokenizers and providers.
_MARGIN = 0.95
# When the upstream's limit cannot be planned against (not stated in tokens, stated in a
# validation answer, or not below what it just refused), the retry asks for this share of
# the rejected request: strictly less, so it is never the same request again.
SHRINK = 0.75
_INLINE_DECODE_BYTES = 256 * 1024

T = TypeVar("T")


async def diagnose(
    response: upstream.UpstreamResponse,
    failure: Callable[[bytes], bytes | None],
    hold: bool = True,
) -> tuple[upstream.UpstreamResponse | Response | Held, Overflow | None]:
    """The response to relay should there be nothing to recover, and the overflow to
    recover from, if any. ``response`` is consumed here, unless it is a 200 stream
    that does not open with an error (then it is returned as it was, its first bytes
    pushed back) or that sends comments first (``Held``: it decides in-stream).
    ``failure``: a stream head's error event, as its API reads one. ``hold`` False: a
    stream's comments are read with its head, never ``Held`` (its answer is read whole
    before any of it goes out: the recall tool's)."""
    if response.status_code == 200:  # a stream whose first event may be the error
        found = await _stream_error(response, failure, hold)
        if found is None:
            return response, None
        if isinstance(found, Held):
            return found, None
        raw, original = found
        verdict = classify_error(400, response.headers, raw)
    else:
        raw, rest = await response.aread_or_rest(_MAX_ERROR_BYTES)
        if rest is not None:  # too big to be an error we can act on: relay it whole
            return await relay(response, started=(raw, rest)), None
        original = buffered(response, raw)
        verdict = classify_error(response.status_code, response.headers, raw)
    return original, (None if verdict.kind == "other" else verdict)


async def retry_once(
    client: Upstream, metrics: Metrics, route: Route, verdict: Overflow, second: Attempt
) -> tuple[upstream.UpstreamResponse, Attempt]:
    """Send ``second`` on ``route`` and count how it went (``metrics``); its answer is
    returned whatever it is, with ``second`` as it answers it (a recovered view's status)."""
    log.warning(
        "upstream rejected the request (%s, %s format, limit %s); retrying once",
        verdict.kind,
        verdict.provider,
        verdict.limit,
    )
    retry = await client.send("POST", route.url, route.headers, second.body)
    labels = {"provider": verdict.provider, "kind": verdict.kind}
    outcome = second.outcome
    if retry.status_code < 400:
        metrics.overflows.labels(**labels, outcome="recovered").inc()
        # A view sent as it came is now trimmed, unless only its output budget was lowered
        # (its outcome says so: X-Compaction-Output-Clamped).
        budget = verdict.kind == "output_budget"
        status = "trimmed" if outcome.status == "passthrough" and not budget else outcome.status
        return retry, replace(second, outcome=replace(outcome, status=status))
    metrics.overflows.labels(**labels, outcome="failed").inc()
    return retry, second


async def _stream_error(
    response: upstream.UpstreamResponse, failure: Callable[[bytes], bytes | None], hold: bool
) -> tuple[bytes, Response] | Held | None:
    """If a 200 event stream opens with an error event (some servers report an overflow
    that way), its JSON and the stream as read so far, as a response to relay should
    the error not be ours to recover; else None, with the bytes read pushed back. A
    stream that sends comments before its first event is ``Held``: it starts now, and
    recovers in-stream should that event be an overflow (stream_head.py)."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return None
    source = response.aiter_raw()
    head = b""
    try:
        async for chunk in source:
            head += chunk
            if first_event(head) is not None or len(head) > MAX_HEAD_BYTES:
                break
            if hold and comments_ahead(head)[0]:  # the model is thinking: the client hears it
                return Held(response, head, source)
        error = failure(head)
        if error is None:
            response.started = (head, source)
            return None
    except BaseException:  # the upstream broke, or the client left: free the connection
        await response.aclose()
        raise
    await response.aclose()
    return error, buffered(response, head)


async def learn_window(
    windows: LearnedWindows, models: ModelTable, turn: Turn, sent: Attempt, verdict: Overflow
) -> tuple[int, bool]:
    """The window to plan the retry against, in the proxy's token units: always below
    what was just rejected; and whether it is the upstream's own statement of the model's
    window (then learned in ``windows`` for this tenant, and its report towards a shared
    window; ``models`` has the configured one)."""
    ours = sent.outcome.tokens + _reserve(turn)
    # A share of what was refused: for answers whose numbers we must not learn from.
    shrunk = int(ours * min(SHRINK, (verdict.fraction or 1.0) * _MARGIN))
    window = _scaled(verdict, ours)
    if verdict.validation:
        # About a field (a 422, a 400 naming another field, Bedrock's characters): its
        # numbers may be the request's own, so they shape this retry at most, never a
        # window anyone keeps.
        return (
            min(shrunk, window) if window is not None and window >= MIN_WINDOW else shrunk
        ), False
    if window is not None:
        if window >= ours or not _consistent(verdict):
            # The stated limit does not explain the refusal (counts disagree, or a limit
            # on something else): trimming to it would resend the same request.
            log.warning("upstream refused a request below its stated limit; shrinking anyway")
            return shrunk, False
        if await _stated_by_upstream(sent.body, verdict):
            configured = models.resolve(turn.model.name).context_window
            learned = await windows.learn(
                turn.model.name, window, turn.tenant, configured=configured, stated=verdict.limit
            )
            return learned, True
    # No limit we can trust (a gateway's 413, a terse server, echoed text, Responses'
    # context_length_exceeded): what we just sent is too much for this caller. The refusal
    # bounds the window by what was sent, not by it plus the reply it reserved (the
    # upstream may not have counted that): learn at most the messages sent, less a margin.
    configured = models.resolve(turn.model.name).context_window
    sent_tokens = int(sent.outcome.tokens * _MARGIN)
    learned = await windows.learn(
        turn.model.name, sent_tokens, turn.tenant, configured=configured, stated=None
    )
    return learned, False


async def retry_view(view: Awaitable[T], *, stated: bool) -> T | None:
    """The compacted view to retry with (and what goes with it), or None when even the
    newest message cannot fit a window of the proxy's making (``stated`` False): that
    number is no window to quote in the proxy's own error, so the upstream's answer
    stands."""
    try:
        return await view
    except ContextTooLarge:
        if stated:  # the upstream's own window: the proxy's error quotes it
            raise
        return None


def _scaled(verdict: Overflow, ours: int) -> int | None:
    """The stated limit in our token units, with a margin: scaled by how the upstream's
    count of the request relates to ours, when it said it."""
    if verdict.limit is None:
        return None
    theirs = verdict.requested or ours
    return int(verdict.limit * min(ours / theirs, 1.0) * _MARGIN) if theirs else 0


def _consistent(verdict: Overflow) -> bool:
    """A request rejected as too long asked for more than the limit, if it says how much."""
    return verdict.requested is None or verdict.limit is None or verdict.requested > verdict.limit


async def _stated_by_upstream(body: bytes, verdict: Overflow) -> bool:
    """Whether the stated limit is the upstream's own word about the model: not text it
    echoed from the request (a role or name quoted in a validation error, or the number
    itself, anywhere in what was sent)."""
    assert verdict.limit is not None
    if verdict.limit_evidence is None:  # a top-level structured field, not free text
        return True
    # Large bodies are decoded off the event loop: this runs only on an overflow.
    if len(body) > _INLINE_DECODE_BYTES:
        sent = await asyncio.to_thread(request_text, body)
    else:
        sent = request_text(body)
    if echoed(verdict, sent) or mentions(sent, verdict.limit):
        log.warning("upstream error repeats request content where it states a limit; not shared")
        return False
    return True


def _reserve(turn: Turn) -> int:
    return output_reserve(turn.chat, turn.model.max_output_tokens)
