"""Which archived passages a turn is about: Okapi BM25 over the session's archive, by
tantivy (chosen by measurement: bench/README.md, "Recall index").

The index grows as the archive does (``add``): a compaction's newly archived passages
are one more segment of an index held in memory, never a rebuild; a query reads only
the postings of its own terms. ``add`` commits and reloads (milliseconds): callers run it
off the event loop; ``search`` is tens of microseconds. Terms are lower-cased words and
numbers; a compound such as ``vendor_contact`` or ``build-4711`` is a term and so is each
of its parts, so a question in plain words finds the ``key=value`` and a question naming
the key finds both.
Common English words are no terms at all: a turn matches a passage by what it is about.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence

import tantivy

_WORD = re.compile(r"[a-z0-9]+(?:[_.:/@-][a-z0-9]+)*")
_PARTS = re.compile(r"[a-z0-9]+")
# Function words and the verbs of a question: what a passage is about is in the rest.
_STOP_WORDS = (
    "a an and are as at be been but by can could did do does for from had has have he her "
    "his how i if in into is it its me my no not of on or our please remember she so that "
    "the their them then there these they this to tell us was we were what when where "
    "which who whom why will with would you your again also any just know let said say "
    "asked recall"
)
_STOP = frozenset(_STOP_WORDS.split())
# tantivy's writer arena: its minimum, held only while ``add`` runs.
_WRITER_BYTES = 15_000_000
# The longest query read: a newest turn may be a 100k-token paste.
QUERY_CHARS = 4000


def terms(text: str) -> list[str]:
    """The index terms of ``text``, in order, repeats kept (BM25 counts them)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        parts = _PARTS.findall(word)
        if len(parts) > 1:
            out.append(word)
        out.extend(p for p in parts if p not in _STOP and (len(p) > 1 or p.isdigit()))
    return out


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query (its first ``QUERY_CHARS`` characters)."""
    return list(dict.fromkeys(terms(text[:QUERY_CHARS])))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    # Documents arrive as their terms (``terms``), space separated: tantivy's own
    # tokenizer would split the compounds this one keeps.
    builder.add_text_field("body", stored=False, tokenizer_name="whitespace")
    builder.add_integer_field("doc", stored=True, indexed=False)
    return builder.build()


_SCHEMA = _schema()


class Ranking:
    """BM25 (tantivy's: k1 1.2, b 0.75) over documents added in order: document ``i``
    is the ``i``-th added. One ``add`` at a time; ``search`` runs alongside it on the
    index as the last ``add`` left it."""

    __slots__ = ("_count", "_index", "_lock", "_searcher")

    def __init__(self) -> None:
        self._index = tantivy.Index(_SCHEMA)
        self._searcher = self._index.searcher()
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def add(self, documents: Iterable[str]) -> None:
        """Index ``documents`` after those already added (blocking: milliseconds)."""
        with self._lock:
            writer = self._index.writer(_WRITER_BYTES, 1)
            count = self._count
            for text in documents:
                writer.add_document(tantivy.Document(body=" ".join(terms(text)), doc=count))
                count += 1
            writer.commit()
            writer.wait_merging_threads()
            self._index.reload()
            self._searcher, self._count = self._index.searcher(), count

    def search(self, query: Sequence[str], limit: int) -> list[tuple[float, int]]:
        """The best ``limit`` (score, document) for the distinct terms ``query``, best
        first; only documents that hold a term score."""
        if not self._count or not query or limit <= 0:
            return []
        should = tantivy.Occur.Should
        clauses = [(should, tantivy.Query.term_query(_SCHEMA, "body", t)) for t in query]
        searcher = self._searcher
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit, count=False).hits
        return [(float(score), int(searcher.doc(address)["doc"][0])) for score, address in hits]
