"""One session's recall index, as a replica keeps it (compaction/recall.py): the
passages of its originals (archived, or dropped by the views of the requests it saw),
their ranking (core/ranking.py), and the excerpt blocks chosen for its user messages.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from proxy.core.history import History
from proxy.core.passages import Original, Passage, split_passages
from proxy.core.ranking import Ranking
from proxy.core.tokens import TokenCounter
from proxy.types import ChatMessage

# An index holds ~10 bytes per archived character (its passages' text and their
# postings: bench/README.md, "Recall index"), ~3 MB at 80k tokens.
BYTES_PER_CHAR = 10
# User messages whose block a session's index keeps (the oldest out first).
BLOCKS = 64


@dataclass(frozen=True, slots=True)
class Block:
    """The excerpts put before one user message: the block, its tokens, how many."""

    text: str
    tokens: int
    count: int  # 0: nothing relevant was found for it


NO_BLOCK = Block("", 0, 0)


@dataclass(slots=True)
class SessionIndex:
    """One session's originals as searched: their passages and their ranking."""

    version: int = -1  # the snapshot version its archive was last read at
    ranking: Ranking = field(default_factory=Ranking)
    passages: list[Passage] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # hashes of the originals indexed
    size: int = 0  # estimated bytes
    # Each user message's block, by (position, digest), so its tool loop's requests carry
    # the same; and the one shown: it stays before its user message, byte for byte, until
    # a later user message has excerpts of its own (the provider's cache holds meanwhile).
    blocks: OrderedDict[tuple[int, str], Block] = field(default_factory=OrderedDict)
    shown: tuple[tuple[int, str], Block] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The history positions below which the request's dropped turns were indexed, and the
    # digest of the last of them (changed: an edited or rewound history, read again).
    sent: int = 0
    sent_digest: bytes = b""
    archived: int = 0  # past the last position the archive (as read, or written) holds

    def add(self, originals: list[Original], counter: TokenCounter) -> None:
        """Index the originals not seen yet (blocking: splitting, counting, indexing)."""
        new: list[Passage] = []
        for original in originals:
            seen = hash((original.position, original.digest, original.text))
            if seen in self.seen:
                continue  # archived twice, or read from the request and the archive: once
            self.seen.add(seen)
            new.extend(split_passages(original, count=counter.text))
        if new:
            self.passages.extend(new)  # first: a search alongside finds each one it ranks
            self.ranking.add(p.text for p in new)
            self.size += BYTES_PER_CHAR * sum(len(p.text) for p in new)

    def unread(self, history: History) -> int:
        """The first position of ``history`` whose dropped turn was not read yet."""
        sent = self.sent
        if sent > len(history.digests) or (sent and history.digests[sent - 1] != self.sent_digest):
            sent = 0  # an edited or rewound history: read again (what is indexed is skipped)
        return max(sent, history.pinned)

    def placed(self, history: History, messages: list[ChatMessage], room: int) -> int | None:
        """Where the block shown goes in ``messages`` (the view): before its user message,
        when the view holds it verbatim after the summary and it fits ``room``. A view
        keeps its tail's messages as the same objects at the same distance from its end
        (rebuild.py, trim.py): no search."""
        if self.shown is None:
            return None
        (position, digest), block = self.shown
        at = position + len(messages) - len(history.messages)
        if position >= len(history.messages) or at < history.pinned or block.tokens > room:
            return None
        if messages[at] is history.messages[position] and history.digests[position].hex() == digest:
            return at
        return None
