"""Recall by excerpts: the step that brings back, verbatim, what the newest turn is
about from the session's archive of originals (archive.py wrote them), for any model.

On a view that carries a summary, the newest user message (and the tool results after
it, if any) is the query; the session's index (core/ranking.py) ranks the archived
passages, and the best few above ``compaction.recall_min_score``, within
``recall_budget_ratio`` of the window and the room the view leaves, go as a block of
excerpts right before the newest user message (core/excerpts.py). Nothing relevant:
nothing inserted. ``Outcome.recalled`` says how many came back (the response header,
the request line); ``compaction_proxy_recalls`` counts outcomes.

Each replica keeps the indexes of its ``SESSIONS`` most recently recalled sessions
(``SessionKey``: the tenant's own; another tenant's key is another index, built from
that tenant's archive only). An index is read again from the store only when the
session's snapshot version moved past the one it was read at, and what is new is added
to it off the event loop; a warm turn costs one search.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from proxy.config import CompactionSettings
from proxy.core.excerpts import (
    Hit,
    choose_excerpts,
    excerpts_tokens,
    newest_user_at,
    render_excerpts,
    with_excerpts,
)
from proxy.core.history import History
from proxy.core.outcome import Outcome
from proxy.core.passages import Original, Passage, split_passages
from proxy.core.ranking import Ranking, query_terms
from proxy.core.session import SessionKey
from proxy.core.tokens import TokenCounter
from proxy.core.transcript import span_sources
from proxy.errors import StoreError
from proxy.observe.metrics import Metrics
from proxy.store import Archive

# Sessions whose index a replica keeps (least recently recalled out first): some 1-2 MB
# each at 100k archived tokens.
SESSIONS = 256
# Originals read into an index inline (more: off the event loop, in a thread).
_INLINE_ORIGINALS = 4
_STATUSES = frozenset({"snapshot", "compacted", "trimmed"})


@dataclass(slots=True)
class _Index:
    """One session's archive as searched: its passages and their ranking."""

    version: int = -1  # the snapshot version its archive was last read at
    ranking: Ranking = field(default_factory=Ranking)
    passages: list[Passage] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # hashes of the originals indexed
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Recall:
    def __init__(self, store: Archive, metrics: Metrics, sessions: int = SESSIONS) -> None:
        self._store = store
        self._sessions = sessions
        self._indexes: OrderedDict[SessionKey, _Index] = OrderedDict()
        self._outcomes = {
            o: metrics.recalls.labels(outcome=o) for o in ("recalled", "none", "no_room")
        }
        self._excerpts = metrics.recalled_excerpts

    async def excerpts(
        self,
        key: SessionKey,
        history: History,
        outcome: Outcome,
        c: CompactionSettings,
        counter: TokenCounter,
        reserve: int,
    ) -> Outcome:
        """``outcome`` with excerpts of ``key``'s archive the newest turn is about before
        its newest user message; ``outcome`` itself when it carries no summary's view,
        recall is off or the archive has nothing relevant."""
        if not c.recall or outcome.messages is None or outcome.status not in _STATUSES:
            return outcome
        newest = _newest_user(history)
        if newest is None:
            return outcome
        index = await self._index(key, outcome.version, counter)
        if not index.passages:
            return outcome
        query = query_terms(_query_text(history, newest))
        hits = [
            Hit(score, index.passages[doc])
            for score, doc in index.ranking.search(query, c.recall_max_excerpts * 2)
        ]
        if not hits or hits[0].score < c.recall_min_score:
            self._outcomes["none"].inc()
            return replace(outcome, recalled=0)
        room = outcome.window - reserve - outcome.tokens
        budget = min(int(outcome.window * c.recall_budget_ratio), room)
        chosen = choose_excerpts(hits, c.recall_min_score, budget, c.recall_max_excerpts)
        at = newest_user_at(outcome.messages, history.messages[newest])
        if not chosen or at is None or at < history.pinned:
            self._outcomes["no_room"].inc()
            return replace(outcome, recalled=0)
        block = render_excerpts(chosen)
        tokens = excerpts_tokens(chosen)
        if tokens > room:
            self._outcomes["no_room"].inc()
            return replace(outcome, recalled=0)
        self._outcomes["recalled"].inc()
        self._excerpts.inc(len(chosen))
        messages = with_excerpts(outcome.messages, at, block)
        recalled = len(chosen)
        return replace(
            outcome, messages=messages, tokens=outcome.tokens + tokens, recalled=recalled
        )

    async def _index(self, key: SessionKey, version: int, counter: TokenCounter) -> _Index:
        """``key``'s index, with what the archive holds up to ``version`` added (its
        passages sized by ``counter``: the excerpts' cost is known before they are
        chosen)."""
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = _Index()
            while len(self._indexes) > self._sessions:
                self._indexes.popitem(last=False)
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
            if len(originals) > _INLINE_ORIGINALS:
                await asyncio.to_thread(_add, index, originals, counter)
            else:
                _add(index, originals, counter)
            index.version = version
        return index

    async def searchable(self, key: SessionKey, outcome: Outcome, counter: TokenCounter) -> Outcome:
        """``outcome`` naming ``key`` as the archive a recall tool searches, when that
        archive holds anything (compaction/recall_tool.py); else ``outcome``."""
        if outcome.messages is None or outcome.status not in _STATUSES:
            return outcome
        index = await self._index(key, outcome.version, counter)
        return replace(outcome, archive=key) if index.passages else outcome

    async def search(
        self,
        outcome: Outcome,
        query: str,
        c: CompactionSettings,
        counter: TokenCounter,
        budget: int,
    ) -> list[Passage]:
        """The passages of ``outcome``'s archive ``query`` asks for, as excerpts choose them
        (above the floor, within ``budget`` tokens, at most ``recall_max_excerpts``)."""
        if outcome.archive is None:
            return []
        index = await self._index(outcome.archive, outcome.version, counter)
        hits = [
            Hit(score, index.passages[doc])
            for score, doc in index.ranking.search(query_terms(query), c.recall_max_excerpts * 2)
        ]
        return choose_excerpts(hits, c.recall_min_score, budget, c.recall_max_excerpts)

    def forget(self, key: SessionKey) -> None:
        """Drop ``key``'s index (its session was deleted)."""
        self._indexes.pop(key, None)


def _add(index: _Index, originals: list[Original], counter: TokenCounter) -> None:
    """Index the originals ``index`` has not seen (blocking: splitting, counting, indexing)."""
    new: list[Passage] = []
    for original in originals:
        seen = hash((original.position, original.role, original.text))
        if seen in index.seen:
            continue  # archived twice (a lost snapshot race), or read before: indexed once
        index.seen.add(seen)
        new.extend(split_passages(original, count=counter.text))
    if new:
        index.passages.extend(new)  # first: a search alongside finds each one it ranks
        index.ranking.add(p.text for p in new)


def _newest_user(history: History) -> int | None:
    messages = history.messages
    for i in range(len(messages) - 1, history.pinned - 1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def _query_text(history: History, newest_user: int) -> str:
    """The newest user message and every message after it (the newest tool results)."""
    return "\n".join(text for _, text in span_sources(history.messages[newest_user:]))
