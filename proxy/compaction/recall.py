"""Recall by excerpts: the step that brings back, verbatim, what the newest turn is
about from the session's archive of originals (snapshots.archive_span wrote them), for
any model.

On a view that carries a summary, the newest user message is the query; the session's
index (core/ranking.py) ranks the archived passages, and the best few (``MAX_EXCERPTS``)
above ``MIN_SCORE`` whose message the history still holds where it was (an edited or
rewound history's discarded turns never come back), within
``compaction.recall_budget_ratio`` of the window and the room the view leaves, go as a
block of excerpts right before the newest user message (core/excerpts.py). Nothing
relevant: nothing inserted. ``Outcome.recalled`` says how many came back (the response header,
the request line); ``compaction_proxy_recalls`` counts outcomes.

A view that drops turns without a summary covering them (``trimmed``: the summary failed,
timed out, or is not due yet) has nothing archived for them; the request itself still
carries them. So every compacted request's dropped turns (between the pinned messages and
the view's verbatim tail) are indexed too, from the request, once per replica
(``SessionIndex.sent``); the ones no summary covers are archived then, in the background
(archiving.py), as a summarized span is.

Each replica keeps the indexes of its ``SESSIONS`` most recently recalled sessions, in
at most ``INDEX_BYTES`` (``SessionKey``: the tenant's own; another tenant's key is another
index, built from that tenant's archive only). An index is read again from the store only when the
session's snapshot version moved past the one it was read at, and what is new is added
to it off the event loop; a warm turn costs one search.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace

from proxy.compaction.archiving import ArchiveWrites
from proxy.compaction.recall_index import BLOCKS, NO_BLOCK, Block, SessionIndex
from proxy.config import CompactionSettings
from proxy.core.excerpts import (
    Hit,
    choose_excerpts,
    dropped_end,
    excerpts_tokens,
    newest_user,
    query_text,
    render_excerpts,
    still_sent,
    with_excerpts,
)
from proxy.core.history import History
from proxy.core.outcome import Outcome, Turn
from proxy.core.passages import Original, Passage, archived_messages
from proxy.core.ranking import query_terms
from proxy.core.session import SessionKey, slot_base
from proxy.core.tokens import TokenCounter, output_reserve
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Archive

# Sessions whose index a replica keeps (least recently recalled out first), and their
# estimated size in all (recall_index.BYTES_PER_CHAR: ~3 MB at 80k tokens).
SESSIONS = 256
INDEX_BYTES = 256 * 1024 * 1024
# Originals read into an index inline (more: off the event loop, in a thread).
_INLINE_ORIGINALS = 4
_STATUSES = frozenset({"snapshot", "compacted", "trimmed"})
# The most excerpts a block quotes, and the least a passage scores to be one (BM25: about
# one term rare in the archive; core/excerpts.py also drops those under 0.4 of the best).
MAX_EXCERPTS = 6
MIN_SCORE = 4.0
Counters = Mapping[str, TokenCounter]


class Recall:
    def __init__(
        self, store: Archive, metrics: Metrics, default: CompactionSettings, counters: Counters
    ) -> None:
        self._store = store
        self._default = default  # a turn without a tenant policy compacts with these
        self._counters = counters  # by tokenizer name
        self.sessions, self.index_bytes = SESSIONS, INDEX_BYTES
        self._bytes = 0  # of the indexes kept
        self._indexes: OrderedDict[SessionKey, SessionIndex] = OrderedDict()
        self._outcomes = {
            o: metrics.archive.recalls.labels(outcome=o) for o in ("recalled", "none", "no_room")
        }
        self._excerpts = metrics.archive.recalled_excerpts
        self._writes = ArchiveWrites(store, metrics)  # a trimmed view's dropped turns

    async def excerpts(
        self, turn: Turn, key: SessionKey, history: History, outcome: Outcome
    ) -> Outcome:
        """``outcome`` with excerpts of ``key``'s archive the newest turn is about before
        its newest user message; ``outcome`` itself when it carries no summary's view,
        recall is off or the archive has nothing relevant."""
        ratio = turn.compaction(self._default).recall_budget_ratio
        if not ratio or outcome.messages is None or outcome.status not in _STATUSES:
            return outcome
        newest = newest_user(history)
        if newest is None:
            return outcome
        base = slot_base(key)
        counter = self._counter(turn)
        index = await self._index(base, outcome.version, counter)
        await self._add_dropped(index, base, history, outcome, counter)
        if not index.passages:
            return outcome
        room = outcome.window - output_reserve(turn.chat, turn.model.max_output_tokens)
        room -= outcome.tokens
        anchor = (newest, history.digests[newest].hex())
        block = index.blocks.get(anchor)
        if block is None:  # this turn's first request: search (its tool loop's reuse it)
            budget = min(int(outcome.window * ratio), room)
            block = index.blocks[anchor] = self._block(index, history, newest, budget)
            while len(index.blocks) > BLOCKS:
                index.blocks.popitem(last=False)
        else:
            self._outcomes["recalled" if block.count else "none"].inc()
        if block.count:
            index.shown = (anchor, block)  # it replaces the one shown before, if any
        at = index.placed(history, outcome.messages, room)
        if at is None or index.shown is None:
            return replace(outcome, recalled=0)
        shown = index.shown[1]
        messages = with_excerpts(outcome.messages, at, shown.text)
        tokens, recalled = outcome.tokens + shown.tokens, shown.count if shown is block else 0
        return replace(outcome, messages=messages, tokens=tokens, recalled=recalled)

    async def _add_dropped(
        self,
        index: SessionIndex,
        key: SessionKey,
        history: History,
        outcome: Outcome,
        counter: TokenCounter,
    ) -> None:
        """Index the turns ``outcome``'s view drops that ``index`` has not read from this
        history yet; archive them when no summary covers them (a trimmed view)."""
        assert outcome.messages is not None
        end = dropped_end(history, outcome.messages)
        start = index.unread(history)
        if end <= start:
            return
        async with index.lock:
            start = index.unread(history)  # another request may have read them meanwhile
            if end <= start:
                return
            positions = range(start, end)
            messages = history.messages
            originals = archived_messages(
                [messages[i] for i in positions], positions, [history.digests[i] for i in positions]
            )
            await self._grow(index, originals, counter)
            index.sent, index.sent_digest = end, history.digests[end - 1]
        unarchived = [o for o in originals if o.position >= index.archived]
        if outcome.status == "trimmed" and unarchived:
            index.archived = end
            self._writes.start(key, unarchived)

    def _block(self, index: SessionIndex, history: History, newest: int, budget: int) -> Block:
        """The excerpts for the newest user message ``history.messages[newest]``."""
        query = query_terms(query_text(history, newest))
        found = index.ranking.search(query, MAX_EXCERPTS * 3)
        hits = [Hit(s, p) for s, doc in found if still_sent(p := index.passages[doc], history)]
        if not hits or hits[0].score < MIN_SCORE:
            self._outcomes["none"].inc()
            return NO_BLOCK
        chosen = choose_excerpts(hits, MIN_SCORE, budget, MAX_EXCERPTS)
        if not chosen:
            self._outcomes["no_room"].inc()
            return NO_BLOCK
        self._outcomes["recalled"].inc()
        self._excerpts.inc(len(chosen))
        return Block(render_excerpts(chosen), excerpts_tokens(chosen), len(chosen))

    def _counter(self, turn: Turn) -> TokenCounter:
        return self._counters[turn.model.tokenizer]

    async def _index(self, key: SessionKey, version: int, counter: TokenCounter) -> SessionIndex:
        """``key``'s index, with what the archive holds up to ``version`` added (its
        passages sized by ``counter``, the turn's tokenizer: the excerpts' cost is known
        before they are chosen)."""
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = SessionIndex()
            while len(self._indexes) > self.sessions:
                self._bytes -= self._indexes.popitem(last=False)[1].size
        else:
            self._indexes.move_to_end(key)
        if index.version >= version:
            return index
        async with index.lock:
            if index.version >= version:  # another request read it meanwhile
                return index
            try:
                originals = await self._store.load_archive(key)
            except StoreError:
                return index  # counted by the store; searched as it is, read again next turn
            await self._grow(index, originals, counter)
            if originals:
                index.archived = max(index.archived, max(o.position for o in originals) + 1)
            index.version = version
            while self._bytes > self.index_bytes and next(iter(self._indexes)) != key:
                self._bytes -= self._indexes.popitem(last=False)[1].size
        return index

    async def _grow(
        self, index: SessionIndex, originals: list[Original], counter: TokenCounter
    ) -> None:
        """``index`` with ``originals`` added (many: off the event loop), counted."""
        before = index.size
        if len(originals) > _INLINE_ORIGINALS:
            await asyncio.to_thread(index.add, originals, counter)
        else:
            index.add(originals, counter)
        self._bytes += index.size - before

    async def searchable(self, turn: Turn, key: SessionKey, outcome: Outcome) -> Outcome:
        """``outcome`` naming ``key``'s archive as the one a recall tool searches, when
        that archive holds anything (compaction/recall_tool.py); else ``outcome``."""
        if outcome.messages is None or outcome.status not in _STATUSES:
            return outcome
        base = slot_base(key)
        index = await self._index(base, outcome.version, self._counter(turn))
        return replace(outcome, archive=base) if index.passages else outcome

    async def search(
        self, outcome: Outcome, query: str, counter: TokenCounter, budget: int
    ) -> list[Passage]:
        """The passages of ``outcome``'s archive ``query`` asks for, as excerpts choose them
        (above ``MIN_SCORE``, within ``budget`` tokens, at most ``MAX_EXCERPTS``)."""
        if outcome.archive is None:
            return []
        index = await self._index(outcome.archive, outcome.version, counter)
        found = index.ranking.search(query_terms(query), MAX_EXCERPTS * 2)
        hits = [Hit(score, index.passages[doc]) for score, doc in found]
        return choose_excerpts(hits, MIN_SCORE, budget, MAX_EXCERPTS)

    async def close(self) -> None:
        await self._writes.close()

    def forget(self, key: SessionKey) -> None:
        """Drop ``key``'s index (its session was deleted)."""
        index = self._indexes.pop(key, None)
        if index is not None:
            self._bytes -= index.size
