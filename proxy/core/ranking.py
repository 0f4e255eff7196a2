"""Which archived passages a turn is about: Okapi BM25 over the session's archive.

The index grows as the archive does (``add``): a compaction's newly archived passages
are appended to the postings already there, never a rebuild. A query asks for its
``QUERY_TERMS`` rarest terms the archive holds (a term it lacks scores nothing, a common
one little), and reads their postings only, at most ``POSTINGS_READ`` of them: a search
costs tens of microseconds whatever the archive's size. Why our own and not a library's
(tantivy, bm25s, rank-bm25 were measured): bench/README.md, "Recall index".

Terms are lower-cased words and numbers; a compound such as ``vendor_contact`` or
``build-4711`` is a term and so is each of its parts, so a question in plain words finds
the ``key=value`` and a question naming the key finds both. Common English words are no
terms at all: a turn matches a passage by what it is about.
"""

from __future__ import annotations

import heapq
import math
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import Stemmer

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
# Snowball's English stemmer (PyStemmer, C): "internally" and "internal", "launches" and
# "launch", "coordinates" and "coordinate" are one term, so a question worded in another
# form of a word than the turn it asks about still finds it. A compound stays whole (its
# parts are stemmed): ``vendor_contact`` is an identifier, not a word. PyStemmer caches
# the words it has stemmed.
_STEM: Callable[[str], str] = Stemmer.Stemmer("english").stemWord
# Okapi BM25's usual constants: term frequency saturates by k1, length normalised by b.
_K1 = 1.2
_B = 0.75
# A term held by at most this share of the documents (one at least) is rare: what a
# passage is about, where a common word is not.
RARE_SHARE = 0.07
# The most postings one search reads, its rarest terms first: its cost is bounded.
POSTINGS_READ = 4000
# The longest query read: a newest turn may be a 100k-token paste.
QUERY_CHARS = 4000
# The terms a search asks for: the query's rarest in the archive (a term the archive
# lacks scores nothing; a common one little, and each costs the search its postings).
QUERY_TERMS = 10
# A term held by at most this share of the documents (one at least) is so rare that a
# document holding it alone is a match, when no document holds two of the query's terms:
# "the migration" of a question is the turn that named the migration, whatever else the
# question says (bench/recall_wordings.py: a question's other words, an inflection away
# from a common word, made the two-term rule miss a fact the question named).
ALONE_SHARE = 0.01
# ...for a query of at most this many distinct terms: a question, not a paste.
ALONE_QUERY_TERMS = 16


def terms(text: str) -> list[str]:
    """The index terms of ``text``, in order, repeats kept (BM25 counts them)."""
    out: list[str] = []
    extend, known = out.extend, _WORD_TERMS
    for word in _WORD.findall(text.lower()):
        found = known.get(word)
        extend(found if found is not None else _word_terms(word))
    return out


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query (its first ``QUERY_CHARS`` characters)."""
    out: set[str] = set()
    update, known = out.update, _WORD_TERMS
    words = set(_WORD.findall(text[:QUERY_CHARS].lower()))
    for word in words:
        found = known.get(word)
        update(found if found is not None else _word_terms(word))
    if not words.isdisjoint(_ASKS_WHO):
        out.add(NAMED)
    return list(out)


# A question about someone ("who", "whom", "whose") asks for a passage that names a
# person, whatever words the two share besides: each passage naming one holds the term
# ``NAMED`` (no word can be it: "#" splits words), which such a question asks for. A
# name: two or more capitalised words in a row, none of them a common word ("Since The"
# is none), as names are written in every language the proxy's users type.
NAMED = "#named"
_ASKS_WHO = frozenset(("who", "whom", "whose"))
_NAME = re.compile(r"\b[A-Z][a-z]+(?:-[A-Z][a-z]+)?(?: [A-Z][a-z]+(?:-[A-Z][a-z]+)?)+\b")


def names_someone(text: str) -> bool:
    """Whether ``text`` names a person, as far as its letters tell (``NAMED``)."""
    return any(_STOP.isdisjoint(m.group().lower().split()) for m in _NAME.finditer(text))


# The terms of each word seen, stemmed once: a word recurs in every turn and every
# query, and a stem costs ten times a lookup. Bounded (a flood of distinct words, a
# hostile tenant's, empties it; it fills again as words recur).
_WORD_TERMS: dict[str, tuple[str, ...]] = {}
_WORD_TERMS_MAX = 1 << 16


def _word_terms(word: str) -> tuple[str, ...]:
    """``word``'s terms: its stem (none for a common or one-letter word), or for a compound
    the compound and each of its parts' stems."""
    if word.isalnum():  # the common case: one plain word or number
        found: tuple[str, ...] = (_STEM(word),) if _kept(word) else ()
    else:
        found = (word, *(_STEM(p) for p in _PARTS.findall(word) if _kept(p)))
    if len(_WORD_TERMS) >= _WORD_TERMS_MAX:
        _WORD_TERMS.clear()
    _WORD_TERMS[word] = found
    return found


def _kept(word: str) -> bool:
    return word not in _STOP and (len(word) > 1 or word.isdigit())


class Ranking:
    """BM25 over documents added in order: document ``i`` is the ``i``-th added. Each
    term's postings are two arrays (documents, term frequencies): some 8 bytes a posting.
    ``add`` from one thread at a time (the caller's lock); ``search`` may run alongside
    it and sees the documents added before it began, or some of those being added."""

    __slots__ = ("_df", "_docs", "_lengths", "_tfs", "_total")

    def __init__(self) -> None:
        self._df: dict[str, int] = {}  # documents holding each term
        self._docs: dict[str, array[int]] = {}
        self._tfs: dict[str, array[int]] = {}
        self._lengths: array[int] = array("I")
        self._total = 0

    def __len__(self) -> int:
        return len(self._lengths)

    def add(self, documents: Iterable[str]) -> None:
        """Index ``documents`` after those already added."""
        docs, tfs, df = self._docs, self._tfs, self._df
        for text in documents:
            doc = len(self._lengths)
            counts = Counter(terms(text))
            if names_someone(text):
                counts[NAMED] = 1
            for term, tf in counts.items():
                if term not in docs:
                    docs[term], tfs[term] = array("I"), array("H")
                docs[term].append(doc)
                tfs[term].append(min(tf, 65535))
                df[term] = df.get(term, 0) + 1
            length = sum(counts.values())
            self._total += length
            self._lengths.append(length)  # last: a search reads only documents it holds

    def search(self, query: Sequence[str], limit: int) -> list[tuple[float, int]]:
        """The best ``limit`` (score, document) for the distinct terms ``query`` (of
        which the ``QUERY_TERMS`` rarest the archive holds), best first. A document must
        hold two of those terms (a compound and its part are two), or the one there is:
        one number or name in common alone is chance; and one of them rare in the archive
        (``RARE_SHARE``): many common words in common (a template, filler) are not a topic.
        Only when no document does, one holding a single term rarer still (``ALONE_SHARE``)
        is a match, for a short query (``ALONE_QUERY_TERMS``): the question names what the
        turn was about and little else it held."""
        n, df = len(self._lengths), self._df
        held = [t for t in query if t in df]
        if not n or not held or limit <= 0:
            return []
        if len(held) > QUERY_TERMS:
            held = heapq.nsmallest(QUERY_TERMS, held, key=df.__getitem__)
        else:
            held.sort(key=df.__getitem__)
        # A long turn (a paste) shares some rare word with some passage by chance.
        fewest = max(1, int(n * ALONE_SHARE)) if len(query) <= ALONE_QUERY_TERMS else 0
        hits = _Hits()
        self._score(held, (max(1, int(n * RARE_SHARE)), fewest), hits)
        chosen = hits.chosen(least=min(2, len(held)))
        best = heapq.nlargest(limit, chosen, key=lambda item: (item[1], -item[0]))
        return [(score, doc) for doc, score in best]

    def _score(self, held: list[str], rarity: tuple[int, int], hits: _Hits) -> None:
        """BM25 of ``held`` (rarest first) into ``hits``, reading at most ``POSTINGS_READ``
        postings; ``rarity``: the most documents a rare term, and one rare enough to match
        alone, may be held by."""
        lengths, docs, n = self._lengths, self._docs, len(self._lengths)
        average = self._total / n or 1.0
        few, fewest = rarity
        scores, matched, read = hits.scores, hits.matched, 0
        for term in held:
            postings, tfs = docs[term], self._tfs[term]
            holding = len(postings)
            if read + holding > POSTINGS_READ and read:
                break
            read += holding
            idf = math.log(1 + (n - holding + 0.5) / (holding + 0.5))
            for doc, tf in zip(postings, tfs, strict=False):
                if doc >= n:
                    break  # being added by a concurrent add
                norm = _K1 * (1 - _B + _B * lengths[doc] / average)
                scores[doc] = scores.get(doc, 0.0) + idf * tf * (_K1 + 1) / (tf + norm)
                matched[doc] = matched.get(doc, 0) + 1
                if holding <= few:
                    hits.rare.add(doc)
                    if holding <= fewest:
                        hits.alone.add(doc)


class _Hits:
    """One search's documents: their scores, how many of its terms each holds, those
    holding a rare term, and those holding one rare enough to match alone."""

    __slots__ = ("alone", "matched", "rare", "scores")

    def __init__(self) -> None:
        self.scores: dict[int, float] = {}
        self.matched: dict[int, int] = {}
        self.rare: set[int] = set()
        self.alone: set[int] = set()

    def chosen(self, least: int) -> list[tuple[int, float]]:
        """(document, score) of those holding ``least`` of the terms, one of them rare;
        else of those holding one rare enough alone."""
        scores, matched, rare = self.scores, self.matched, self.rare
        found = [(d, v) for d, v in scores.items() if matched[d] >= least and d in rare]
        return found or [(d, v) for d, v in scores.items() if d in self.alone]
