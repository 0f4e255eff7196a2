"""Steps 3-8: decide what the upstream sees for one chat request.

``prepare`` turns the client's full history into the API view: the history
itself, or pinned messages + handoff summary + verbatim tail. It loads and
validates the session's snapshot, counts tokens, plans, summarizes under the
session's single-flight lock, writes the new snapshot (compare-and-swap) and
rebuilds the messages. A failing summarizer never fails the request: the
view falls back to deterministic trimming and summarization is retried on a
later turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from cachetools import LRUCache

from proxy.calibrate import Calibration
from proxy.config import Settings
from proxy.digest import digests_and_sizes, prefix_hash
from proxy.errors import ContextTooLarge, SummaryError, SummaryTruncated
from proxy.identifiers import Restored, restore_identifiers
from proxy.metrics import Metrics
from proxy.models import ModelTable, ResolvedModel
from proxy.plan import Budget, Plan, View, count_pinned, plan_compaction, trim_plan, view_tokens
from proxy.rebuild import handoff_text, omitted_marker, rebuild_messages
from proxy.session import SessionKey, session_from_header, session_from_history
from proxy.store import Snapshot, SnapshotStore
from proxy.summarize import SummaryRequest, span_text, summarize
from proxy.tokens import TokenCounter, bounded_by, output_reserve
from proxy.types import ChatMessage, ChatRequest
from proxy.upstream import UpstreamClient, upstream_url

log = logging.getLogger("proxy.compaction")

Status = Literal["passthrough", "snapshot", "compacted", "trimmed", "bypassed"]
# Framing tokens around a summary: the handoff text and the acknowledgement turn.
_FRAME_TOKENS = 60
_POLL_S = 0.05
# A summary takes at most this share of the chat model's window (4k window: ~600).
_SUMMARY_SHARE = 0.15
_MIN_SUMMARY = 128
# Most sessions with a pending or recent forced compaction tracked per process.
_TRACKED_LIMIT = 10_000
_SCHEDULE_TTL_S = 3600.0
# CPU on the event loop stalls every request, /healthz included; a hop to a worker
# thread costs ~0.1 ms, more than a usual turn's counting (a few dozen cached
# messages: ~0.05 ms). Tokenizing runs at ~70 ns a byte, so up to 32 KiB of
# uncounted text (~2.5 ms) stays inline and the hop is under 5% of anything larger.
_INLINE_COUNT_BYTES = 32 * 1024
# Digesting runs at ~1.3 ns a byte and ~0.6 us a message: ~1.5 ms at these sizes.
_INLINE_DIGEST_BYTES = 1024 * 1024
_INLINE_MESSAGES = 2_000


@dataclass(frozen=True, slots=True)
class Turn:
    """One chat request, as the compaction steps see it."""

    chat: ChatRequest
    body: bytes
    model: ResolvedModel
    tenant: str
    session_header: str | None
    auth_headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The API view for one request; ``messages`` None means send the body as is."""

    status: Status
    messages: list[ChatMessage] | None
    version: int
    tokens: int
    window: int
    key: SessionKey | None = None
    # False when ``tokens`` is a rough size estimate, not a count.
    counted: bool = True
    # Identifiers the new summary had lost and the proxy put back (identifiers.py).
    restored: int = 0

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-compaction-status", self.status.encode()),
            (b"x-compaction-version", str(self.version).encode()),
            (b"x-context-tokens", str(self.tokens).encode()),
            (b"x-context-window", str(self.window).encode()),
        ]


@dataclass(slots=True)
class Compactor:
    """Per-process compaction state; one per app, built in the lifespan."""

    settings: Settings
    store: SnapshotStore
    counters: dict[str, TokenCounter]
    client: UpstreamClient  # summaries are asked of the upstream through it
    calibration: Calibration
    models: ModelTable
    metrics: Metrics
    # X-Compaction: force, per session: when it last took effect (rate limit).
    # Bounded: when every entry is recent, the least recently forced goes first.
    last_forced: LRUCache[str, float] = field(default_factory=lambda: LRUCache(_TRACKED_LIMIT))
    # Header sessions this replica scheduled (POST /sessions/{id}/compact): their next
    # request skips the far-below fast path, which never reads the store. Only a hint,
    # bounded; the schedule itself lives in the snapshot, for every replica.
    schedule_hints: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # Sessions whose summarization lock outlived a full wait: until when not to wait again.
    stalled_locks: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def window(self, model: ResolvedModel) -> int:
        # Already in our own token units: the pipeline's step 2 (effective_model) applied
        # calibration and learned windows, once, for this tenant.
        return model.context_window

    def summary_tokens(self, model: ResolvedModel) -> int:
        """How long a summary may be: the configured maximum, but never so much of a
        small window that no recent turn could stay verbatim beside it."""
        share = int(self.window(model) * _SUMMARY_SHARE)
        return max(min(self.settings.compaction.summary_max_tokens, share), _MIN_SUMMARY)

    def budget(self, model: ResolvedModel, reserve: int, fixed: int) -> Budget:
        c = self.settings.compaction
        window = self.window(model)
        return Budget(
            window=window,
            reserve=reserve,
            fixed=fixed,
            trigger=int(window * c.trigger_ratio),
            target=int(window * c.target_ratio),
            summary_allowance=self.summary_tokens(model) + _FRAME_TOKENS,
            min_tail_messages=c.min_tail_messages,
            elide_min_tokens=c.elide_min_tokens,
        )

    def session_key(
        self, tenant: str, header: str | None, chat: ChatRequest, digests: list[bytes]
    ) -> SessionKey:
        if header:
            return session_from_header(tenant, header)
        return session_from_history(tenant, chat["messages"], digests)

    async def prepare(self, turn: Turn, *, force: bool = False, recover: bool = False) -> Outcome:
        """The API view for ``turn``. ``recover``: the upstream just rejected a
        larger view, so compact now (no rate limit) against ``turn.model``'s window."""
        chat, body, model = turn.chat, turn.body, turn.model
        tenant, session_header, auth_headers = turn.tenant, turn.session_header, turn.auth_headers
        messages = chat["messages"]
        window = self.window(model)
        reserve = output_reserve(chat, model.max_output_tokens)
        c = self.settings.compaction
        # Far below the trigger: no store round trip, no counting.
        far_below = bounded_by(body, len(messages), int(window * c.trigger_ratio) - reserve)
        hinted = self._take_hint(tenant, session_header)
        if far_below and not (force or recover or hinted):
            return Outcome("passthrough", None, 0, len(body) // 4, window, counted=False)

        counter = self.counters[model.tokenizer]
        digests, counts, fixed = await _measure(counter, chat, body)
        key = self.session_key(tenant, session_header, chat, digests)
        if force and not self._may_force(key):
            force = False
        budget = self.budget(model, reserve, fixed)
        pinned = count_pinned(messages, c.pin_first_user)
        snapshot = await self._valid_snapshot(key, messages, digests, pinned)
        force = force or recover or _scheduled(snapshot)
        view = _view_of(snapshot, pinned)
        plan = plan_compaction(counts, messages, pinned, view, budget, force=force)
        if plan.action == "keep":
            if not plan.fits:
                # Nothing worth summarizing, yet over the window: trim what we can.
                return self._trimmed(key, messages, counts, pinned, snapshot, budget)
            return self._outcome(snapshot, messages, pinned, plan.view, counts, budget, key)

        started = time.monotonic()
        outcome = await self._compact(
            key, chat, model, counts, digests, pinned, snapshot, plan, budget, auth_headers, force
        )
        self.metrics.compactions.labels(outcome=outcome.status).inc()
        log.info(
            "compaction session=%s outcome=%s tokens_before=%d tokens_after=%d version=%d "
            "restored_identifiers=%d duration_ms=%d",
            key.log_id,
            outcome.status,
            view_tokens(counts, messages, pinned, view, budget),
            outcome.tokens,
            outcome.version,
            outcome.restored,
            (time.monotonic() - started) * 1000,
        )
        return outcome

    def _may_force(self, key: SessionKey) -> bool:
        now = time.monotonic()
        interval = self.settings.compaction.force_interval_s
        last = self.last_forced.get(key.storage_key)
        if last is not None and now - last < interval:
            return False
        self.last_forced[key.storage_key] = now  # clients choose session ids: bounded
        return True

    async def schedule_compaction(self, key: SessionKey) -> bool:
        """Make the session's next request compact (POST /sessions/{id}/compact): the
        request is written into the session's snapshot, so every replica sees it and it
        costs nothing beyond the session itself. False when there is no such session."""
        for _ in range(3):  # a concurrent compaction may win the compare-and-swap
            snapshot = await self.store.load(key.storage_key)
            if snapshot is None:
                return False
            scheduled = replace(
                snapshot, version=snapshot.version + 1, compact_requested_at=time.time()
            )
            if await self.store.save(key.storage_key, scheduled):
                break
        self.schedule_hints[key.storage_key] = None
        if len(self.schedule_hints) > _TRACKED_LIMIT:
            self.schedule_hints.popitem(last=False)
        return True

    def _take_hint(self, tenant: str, session_header: str | None) -> bool:
        if not self.schedule_hints or not session_header:
            return False
        key = session_from_header(tenant, session_header).storage_key
        return self.schedule_hints.pop(key, False) is None

    async def _valid_snapshot(
        self, key: SessionKey, messages: Sequence[ChatMessage], digests: list[bytes], pinned: int
    ) -> Snapshot | None:
        """The stored snapshot if this history still starts with what it covers (invariant 2)."""
        snapshot = await self.store.load(key.storage_key)
        if snapshot is None:
            return None
        anchor = snapshot.anchor
        valid = (
            snapshot.pinned == pinned
            and anchor < len(messages)  # the newest message is never covered
            and prefix_hash(digests, anchor) == snapshot.anchor_hash
        )
        if not valid:
            log.info(
                "session=%s snapshot v%d no longer matches the history; re-planning",
                key.log_id,
                snapshot.version,
            )
            # Keep its version so the replacement's compare-and-swap can succeed.
            return replace(
                snapshot,
                summary="",
                covered=pinned,
                elide_before=pinned,
                summary_tokens=0,
                anchor_hash="",
            )
        return snapshot

    def _outcome(
        self,
        snapshot: Snapshot | None,
        messages: list[ChatMessage],
        pinned: int,
        view: View,
        counts: Sequence[int],
        budget: Budget,
        key: SessionKey,
        status: Status | None = None,
        summary: str | None = None,
    ) -> Outcome:
        summary = summary if summary is not None else (snapshot.summary if snapshot else None)
        tokens = view_tokens(counts, messages, pinned, view, budget) - budget.reserve
        untouched = view.covered == pinned and view.elide_before <= pinned
        if untouched:  # no snapshot applied (none, or one this history no longer matches)
            return Outcome(status or "passthrough", None, 0, tokens, budget.window, key)
        rebuilt = rebuild_messages(
            messages,
            pinned,
            view,
            summary or None,
            counts,
            budget.elide_min_tokens,
            summary_role=self.settings.compaction.summary_role,
        )
        version = snapshot.version if snapshot else 0
        return Outcome(status or "snapshot", rebuilt, version, tokens, budget.window, key)

    async def _compact(
        self,
        key: SessionKey,
        chat: ChatRequest,
        model: ResolvedModel,
        counts: list[int],
        digests: list[bytes],
        pinned: int,
        snapshot: Snapshot | None,
        plan: Plan,
        budget: Budget,
        auth_headers: list[tuple[bytes, bytes]],
        force: bool,
    ) -> Outcome:
        messages = chat["messages"]
        start, end = plan.summarize
        previous = snapshot.summary if snapshot else ""
        if start == end:
            # Elision alone was enough: no model call, no lock needed.
            new = self._snapshot(
                snapshot, previous, pinned, plan.view, digests, counts, budget, model, plan.tokens
            )
            await self._save(key, new)
            return self._outcome(new, messages, pinned, plan.view, counts, budget, key, "compacted")

        lock_ttl = self.settings.compaction.summary_timeout_s + 5
        token = await self.store.acquire(key.storage_key, lock_ttl)
        if token is None:
            return await self._wait_for_other(key, chat, counts, digests, pinned, snapshot, budget)
        try:
            fresh = await self._valid_snapshot(key, messages, digests, pinned)
            if (fresh.version if fresh else 0) != (snapshot.version if snapshot else 0):
                # Another request (maybe on another replica) compacted between our
                # plan and the lock: plan again from its snapshot instead of repeating it.
                snapshot, previous = fresh, fresh.summary if fresh else ""
                plan = plan_compaction(
                    counts, messages, pinned, _view_of(fresh, pinned), budget, force=force
                )
                start, end = plan.summarize
                if start == end:
                    if plan.fits:
                        return self._outcome(
                            snapshot, messages, pinned, plan.view, counts, budget, key
                        )
                    return self._trimmed(key, messages, counts, pinned, snapshot, budget)
            summary_req = self._summary_request(chat, model, auth_headers)
            span = messages[start:end]
            try:
                made = await summarize(summary_req, previous, span)
            except SummaryError as exc:
                self.metrics.summary_failures.inc()
                if isinstance(exc, SummaryTruncated):
                    self.metrics.summaries_truncated.inc()
                    self.metrics.summary_length_retries.inc(exc.length_retries)
                log.warning(
                    "session=%s summarization failed (%s); trimming instead", key.log_id, exc
                )
                return self._trimmed(key, messages, counts, pinned, snapshot, budget)
            if made.length_retries:
                self.metrics.summary_length_retries.inc(made.length_retries)
            kept = await _restore(made.text, previous, span, self.summary_tokens(model))
            if kept.restored:
                self.metrics.identifiers_restored.inc(kept.restored)
            summary = kept.summary
            counter = self.counters[model.tokenizer]
            summary_tokens = await _count_text(counter, handoff_text(summary))
            view = replace(plan.view, summary_tokens=summary_tokens + _FRAME_TOKENS)
            new = self._snapshot(
                snapshot, summary, pinned, view, digests, counts, budget, model, plan.tokens
            )
            await self._save(key, new)
            outcome = self._outcome(
                new, messages, pinned, view, counts, budget, key, "compacted", summary
            )
            return replace(outcome, restored=kept.restored)
        finally:
            await self.store.release(key.storage_key, token)

    async def _wait_for_other(
        self,
        key: SessionKey,
        chat: ChatRequest,
        counts: list[int],
        digests: list[bytes],
        pinned: int,
        snapshot: Snapshot | None,
        budget: Budget,
    ) -> Outcome:
        """Another request is summarizing this session: wait (bounded), then use its result."""
        messages = chat["messages"]
        before = snapshot.version if snapshot else 0
        now = time.monotonic()
        # A wait on this lock already ran out: its holder is likely gone (a replica that
        # died mid-summary), so later turns do not wait it out again until it expires.
        stalled = self.stalled_locks.get(key.storage_key, 0.0) > now
        deadline = now + (0 if stalled else self.settings.compaction.wait_for_summary_s)
        while time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
            fresh = await self._valid_snapshot(key, messages, digests, pinned)
            if fresh is not None and fresh.version > before:
                snapshot = fresh
                break
            # The holder may have finished without a new snapshot (its summary
            # failed, or it had nothing to do): stop waiting once the lock is free.
            probe = await self.store.acquire(key.storage_key, _POLL_S)
            if probe is not None:
                await self.store.release(key.storage_key, probe)
                break
        else:
            if not stalled:
                lock_ttl = self.settings.compaction.summary_timeout_s + 5
                self.stalled_locks[key.storage_key] = time.monotonic() + lock_ttl
                if len(self.stalled_locks) > _TRACKED_LIMIT:
                    self.stalled_locks.popitem(last=False)
                log.warning(
                    "session=%s waited %.0f s for another summary; not waiting again for %.0f s",
                    key.log_id,
                    self.settings.compaction.wait_for_summary_s,
                    lock_ttl,
                )
        view = _view_of(snapshot, pinned)
        if view_tokens(counts, messages, pinned, view, budget) <= budget.window:
            return self._outcome(snapshot, messages, pinned, view, counts, budget, key)
        return self._trimmed(key, messages, counts, pinned, snapshot, budget)

    def _trimmed(
        self,
        key: SessionKey,
        messages: list[ChatMessage],
        counts: list[int],
        pinned: int,
        snapshot: Snapshot | None,
        budget: Budget,
    ) -> Outcome:
        """Deterministic fallback: drop whole oldest groups, mark the gap. Not stored."""
        current = _view_of(snapshot, pinned)
        if view_tokens(counts, messages, pinned, current, budget) <= budget.window:
            # It still fits as it is: forward without losing anything.
            return self._outcome(snapshot, messages, pinned, current, counts, budget, key)
        view = trim_plan(counts, messages, pinned, current, budget, budget.target)
        dropped = view.covered - current.covered
        previous = snapshot.summary if snapshot else ""
        summary = previous
        if dropped:
            marker = omitted_marker(dropped)
            summary = f"{previous}\n\n{marker}" if previous else marker
        outcome = self._outcome(
            snapshot, messages, pinned, view, counts, budget, key, "trimmed", summary
        )
        if outcome.tokens + budget.reserve > budget.window:
            self._raise_if_newest_too_large(messages, counts, pinned, budget)
        return outcome

    def _raise_if_newest_too_large(
        self, messages: list[ChatMessage], counts: list[int], pinned: int, budget: Budget
    ) -> None:
        newest = counts[-1] + sum(counts[:pinned]) + budget.fixed + budget.reserve
        if newest > budget.window:
            raise ContextTooLarge(
                f"This model's maximum context length is {budget.window} tokens. However, the "
                f"newest message alone needs about {newest} tokens with the system prompt, tool "
                "definitions and reserved output. Please reduce the length of the message.",
                param="messages",
            )

    def _summary_request(
        self, chat: ChatRequest, model: ResolvedModel, auth_headers: list[tuple[bytes, bytes]]
    ) -> SummaryRequest:
        c = self.settings.compaction
        summarizer = self.models.resolve(c.summarizer_model) if c.summarizer_model else model
        window = c.summarizer_context_window or summarizer.context_window
        # The proxy's own summary budget, not the chat model's reply reserve
        # (max_output_tokens): a summary cut short by that loses its end. Capped only by
        # what the summarizer can write, when configured (an upstream that refuses more
        # states its limit, and summarize.py asks again within it).
        max_tokens = self.summary_tokens(model)
        if c.summarizer_max_output_tokens:
            max_tokens = min(max_tokens, c.summarizer_max_output_tokens)
        # Room for the transcript: the window less the answer and the prompt's
        # own framing, in characters at a conservative 3 per token.
        room = max(window - max_tokens - 2 * _FRAME_TOKENS - 600, 256)
        return SummaryRequest(
            client=self.client,
            url=upstream_url(self.settings.upstream.base_url, "chat/completions", b""),
            headers=auth_headers,
            model=c.summarizer_model or chat["model"],
            max_tokens=max_tokens,
            timeout_s=c.summary_timeout_s,
            max_chunk_chars=room * 3,
        )

    def _snapshot(
        self,
        old: Snapshot | None,
        summary: str,
        pinned: int,
        view: View,
        digests: list[bytes],
        counts: Sequence[int],
        budget: Budget,
        model: ResolvedModel,
        tokens_after: int,
    ) -> Snapshot:
        now = time.time()
        anchor = max(view.covered, view.elide_before)
        return Snapshot(
            version=(old.version if old else 0) + 1,
            summary=summary,
            pinned=pinned,
            covered=view.covered,
            elide_before=view.elide_before,
            anchor_hash=prefix_hash(digests, anchor),
            summary_tokens=view.summary_tokens,
            tokens_before=sum(counts) + budget.fixed + budget.reserve,
            tokens_after=tokens_after,
            created_at=old.created_at if old and old.created_at else now,
            updated_at=now,
            model=model.name,
        )

    async def _save(self, key: SessionKey, snapshot: Snapshot) -> None:
        if not await self.store.save(key.storage_key, snapshot):
            # A concurrent writer got there first; its snapshot is as valid as ours.
            log.info("session=%s snapshot v%d lost a write race", key.log_id, snapshot.version)


async def _measure(
    counter: TokenCounter, chat: ChatRequest, body: bytes
) -> tuple[list[bytes], list[int], int]:
    """Message digests, per-message token counts, and the tokens outside the messages.

    Small or cached work runs inline; a large history or much new text runs in a
    worker thread, so one huge request cannot freeze the proxy for everyone.
    """
    messages = chat["messages"]
    if len(body) > _INLINE_DIGEST_BYTES or len(messages) > _INLINE_MESSAGES:
        return await asyncio.to_thread(_digest_and_count, counter, chat)
    digests, sizes = digests_and_sizes(messages)
    # The body bounds whatever is left to tokenize: small ones need no cache check.
    if len(body) > _INLINE_COUNT_BYTES and (
        counter.pending_bytes(chat, digests, sizes) > _INLINE_COUNT_BYTES
    ):
        counts, fixed = await asyncio.to_thread(_count, counter, chat, digests)
    else:
        counts, fixed = _count(counter, chat, digests)
    return digests, counts, fixed


def _digest_and_count(
    counter: TokenCounter, chat: ChatRequest
) -> tuple[list[bytes], list[int], int]:
    digests, _ = digests_and_sizes(chat["messages"])
    return (digests, *_count(counter, chat, digests))


def _count(counter: TokenCounter, chat: ChatRequest, digests: list[bytes]) -> tuple[list[int], int]:
    return counter.messages(chat["messages"], digests), counter.fixed(chat)


async def _count_text(counter: TokenCounter, text: str) -> int:
    if len(text) > _INLINE_COUNT_BYTES:  # characters: at least as many bytes
        return await asyncio.to_thread(counter.text, text)
    return counter.text(text)


async def _restore(
    summary: str, previous: str, span: Sequence[ChatMessage], max_chars: int
) -> Restored:
    """``summary`` with the identifiers it lost from ``previous`` and ``span`` put back."""
    sources = [previous, span_text(span)]
    if sum(len(text) for text in sources) > _INLINE_COUNT_BYTES:
        return await asyncio.to_thread(restore_identifiers, summary, sources, max_chars)
    return restore_identifiers(summary, sources, max_chars)


def _scheduled(snapshot: Snapshot | None) -> bool:
    """Whether POST /sessions/{id}/compact asked this session to compact (recently)."""
    if snapshot is None or not snapshot.compact_requested_at:
        return False
    return time.time() - snapshot.compact_requested_at < _SCHEDULE_TTL_S


def _view_of(snapshot: Snapshot | None, pinned: int) -> View:
    if snapshot is None:
        return View(covered=pinned, summary_tokens=0, elide_before=pinned)
    return View(
        covered=snapshot.covered,
        summary_tokens=snapshot.summary_tokens,
        elide_before=snapshot.elide_before,
    )
