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
from dataclasses import dataclass, field, replace

from proxy.config import CompactionSettings
from proxy.core.excerpts import (
    Hit,
    choose_excerpts,
    excerpts_tokens,
    render_excerpts,
    with_excerpts,
)
from proxy.core.history import History
from proxy.core.outcome import Outcome, Turn
from proxy.core.passages import Original, Passage, split_passages
from proxy.core.ranking import Ranking, query_terms
from proxy.core.session import SessionKey, slot_base
from proxy.core.tokens import TokenCounter, output_reserve
from proxy.core.transcript import span_sources
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Archive
from proxy.types import ChatMessage

# Sessions whose index a replica keeps (least recently recalled out first), and their
# estimated size in all: an index holds ~10 bytes per archived character (its passages'
# text and their postings: bench/README.md, "Recall index"), ~3 MB at 80k tokens.
SESSIONS = 256
INDEX_BYTES = 256 * 1024 * 1024
_BYTES_PER_CHAR = 10
# Originals read into an index inline (more: off the event loop, in a thread).
_INLINE_ORIGINALS = 4
_STATUSES = frozenset({"snapshot", "compacted", "trimmed"})
# User messages whose block a session's index keeps (the oldest out first).
BLOCKS = 64
# The most excerpts a block quotes, and the least a passage scores to be one (BM25: about
# one term rare in the archive; core/excerpts.py also drops those under 0.4 of the best).
MAX_EXCERPTS = 6
MIN_SCORE = 4.0
Counters = Mapping[str, TokenCounter]


@dataclass(frozen=True, slots=True)
class _Block:
    """The excerpts put before one user message: the block, its tokens, how many."""

    text: str
    tokens: int
    count: int  # 0: nothing relevant was found for it


_NONE = _Block("", 0, 0)


@dataclass(slots=True)
class _Index:
    """One session's archive as searched: its passages and their ranking."""

    version: int = -1  # the snapshot version its archive was last read at
    ranking: Ranking = field(default_factory=Ranking)
    passages: list[Passage] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # hashes of the originals indexed
    size: int = 0  # estimated bytes
    # Each user message's block, by (position, digest), so its tool loop's requests carry
    # the same; and the one shown: it stays before its user message, byte for byte, until
    # a later user message has excerpts of its own (the provider's cache holds meanwhile).
    blocks: OrderedDict[tuple[int, str], _Block] = field(default_factory=OrderedDict)
    shown: tuple[tuple[int, str], _Block] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Recall:
    def __init__(
        self, store: Archive, metrics: Metrics, default: CompactionSettings, counters: Counters
    ) -> None:
        self._store = store
        self._default = default  # a turn without a tenant policy compacts with these
        self._counters = counters  # by tokenizer name
        self.sessions, self.index_bytes = SESSIONS, INDEX_BYTES
        self._bytes = 0  # of the indexes kept
        self._indexes: OrderedDict[SessionKey, _Index] = OrderedDict()
        self._outcomes = {
            o: metrics.archive.recalls.labels(outcome=o) for o in ("recalled", "none", "no_room")
        }
        self._excerpts = metrics.archive.recalled_excerpts

    async def excerpts(
        self, turn: Turn, key: SessionKey, history: History, outcome: Outcome
    ) -> Outcome:
        """``outcome`` with excerpts of ``key``'s archive the newest turn is about before
        its newest user message; ``outcome`` itself when it carries no summary's view,
        recall is off or the archive has nothing relevant."""
        ratio = turn.compaction(self._default).recall_budget_ratio
        if not ratio or outcome.messages is None or outcome.status not in _STATUSES:
            return outcome
        newest = _newest_user(history)
        if newest is None:
            return outcome
        index = await self._index(slot_base(key), outcome.version, self._counter(turn))
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
        at = _placed(index, history, outcome.messages, room)
        if at is None or index.shown is None:
            return replace(outcome, recalled=0)
        shown = index.shown[1]
        messages = with_excerpts(outcome.messages, at, shown.text)
        tokens, recalled = outcome.tokens + shown.tokens, shown.count if shown is block else 0
        return replace(outcome, messages=messages, tokens=tokens, recalled=recalled)

    def _block(self, index: _Index, history: History, newest: int, budget: int) -> _Block:
        """The excerpts for the newest user message ``history.messages[newest]``."""
        query = query_terms(_query_text(history, newest))
        found = index.ranking.search(query, MAX_EXCERPTS * 3)
        hits = [Hit(s, p) for s, doc in found if _still_sent(p := index.passages[doc], history)]
        if not hits or hits[0].score < MIN_SCORE:
            self._outcomes["none"].inc()
            return _NONE
        chosen = choose_excerpts(hits, MIN_SCORE, budget, MAX_EXCERPTS)
        if not chosen:
            self._outcomes["no_room"].inc()
            return _NONE
        self._outcomes["recalled"].inc()
        self._excerpts.inc(len(chosen))
        return _Block(render_excerpts(chosen), excerpts_tokens(chosen), len(chosen))

    def _counter(self, turn: Turn) -> TokenCounter:
        return self._counters[turn.model.tokenizer]

    async def _index(self, key: SessionKey, version: int, counter: TokenCounter) -> _Index:
        """``key``'s index, with what the archive holds up to ``version`` added (its
        passages sized by ``counter``, the turn's tokenizer: the excerpts' cost is known
        before they are chosen)."""
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = _Index()
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
            before = index.size
            if len(originals) > _INLINE_ORIGINALS:
                await asyncio.to_thread(_add, index, originals, counter)
            else:
                _add(index, originals, counter)
            index.version = version
            self._bytes += index.size - before
            while self._bytes > self.index_bytes and next(iter(self._indexes)) != key:
                self._bytes -= self._indexes.popitem(last=False)[1].size
        return index

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

    def forget(self, key: SessionKey) -> None:
        """Drop ``key``'s index (its session was deleted)."""
        index = self._indexes.pop(key, None)
        if index is not None:
            self._bytes -= index.size


def _add(index: _Index, originals: list[Original], counter: TokenCounter) -> None:
    """Index the originals ``index`` has not seen (blocking: splitting, counting, indexing)."""
    new: list[Passage] = []
    for original in originals:
        seen = hash((original.position, original.digest, original.text))
        if seen in index.seen:
            continue  # archived twice (a lost snapshot race), or read before: indexed once
        index.seen.add(seen)
        new.extend(split_passages(original, count=counter.text))
    if new:
        index.passages.extend(new)  # first: a search alongside finds each one it ranks
        index.ranking.add(p.text for p in new)
        index.size += _BYTES_PER_CHAR * sum(len(p.text) for p in new)


def _placed(index: _Index, history: History, messages: list[ChatMessage], room: int) -> int | None:
    """Where the session's block shown goes in ``messages`` (the view): before its user
    message, when the view holds it verbatim after the summary and it fits ``room``. A
    view keeps its tail's messages as the same objects at the same distance from its end
    (rebuild.py, trim.py): no search."""
    if index.shown is None:
        return None
    (position, digest), block = index.shown
    at = position + len(messages) - len(history.messages)
    if position >= len(history.messages) or at < history.pinned or block.tokens > room:
        return None
    if messages[at] is history.messages[position] and _digest(history, position) == digest:
        return at
    return None


def _digest(history: History, position: int) -> str:
    return history.digests[position].hex()


def _still_sent(passage: Passage, history: History) -> bool:
    """Whether ``passage``'s message is still where it was in the history the client sent:
    an edited, rewound or branched history's discarded turns are never brought back."""
    digests = history.digests
    return passage.position < len(digests) and digests[passage.position].hex() == passage.digest


def _newest_user(history: History) -> int | None:
    messages = history.messages
    for i in range(len(messages) - 1, history.pinned - 1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def _query_text(history: History, newest_user: int) -> str:
    """The newest user message. Not the tool results after it: a tool loop's requests
    then carry the same block, byte for byte, and the provider's cache holds through it."""
    return span_sources(history.messages[newest_user : newest_user + 1])[0][1]
