"""Which full-text ranking the archive's recall uses: build, incremental add and query
time on a 100k-token session's archive, for each candidate installed.

    python bench/recall_index.py [--tokens 100000] [--repeat 200]

Candidates: the project's own BM25 (proxy/core/ranking.py), tantivy, bm25s, rank-bm25;
one not installed is skipped (``pip install tantivy bm25s rank-bm25``: none is a
dependency). Each indexes the same passages (core/passages.py) and answers the same
questions; the figures are medians over ``--repeat`` queries, each alone, caches warm:
what a query costs inside a warm turn is ``warm_profile.py --recall both``'s. Results and
the choice: bench/README.md, "Recall index".
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from proxy.core.passages import Original, Passage, split_passages
from proxy.core.ranking import Ranking, query_terms, terms
from proxy.simulator.replies import filler_words


def archive(tokens: int) -> list[Passage]:
    """About ``tokens`` of archived turns: user turns stating facts in sentences, answers
    of filler words, and tool outputs of log lines."""
    originals, total, i = [], 0, 0
    while total < tokens:
        seed = i.to_bytes(8, "little")
        words = filler_words(seed, 180)
        if i % 3 == 0:
            text = f"Note that the owner of service{i} is person{i}. " + " ".join(words)
            role = "user"
        elif i % 3 == 1:
            text = "ok: " + " ".join(words)
            role = "assistant"
        else:
            text = "\n".join(
                f"ts={i}.{k} level=info msg={w} id=req-{i}-{k}" for k, w in enumerate(words[:30])
            )
            role = "tool"
        originals.append(Original(i, role, text))
        total += len(text) // 4
        i += 1
    return [p for o in originals for p in split_passages(o)]


QUESTIONS = [f"Who is the owner of service{i}? Please answer briefly." for i in range(0, 600, 9)]


def timed(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def tantivy_(ps: list[Passage], extra: list[Passage], repeat: int) -> tuple[float, float, float]:
    import tantivy

    schema_builder = tantivy.SchemaBuilder()
    schema_builder.add_text_field("body", stored=False)
    schema_builder.add_integer_field("doc", stored=True)
    schema = schema_builder.build()

    def build() -> tantivy.Index:
        index = tantivy.Index(schema)
        writer = index.writer(15_000_000, 1)
        for n, p in enumerate(ps):
            writer.add_document(tantivy.Document(body=p.text, doc=n))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        return index

    built = timed(build, 5)
    index = build()
    searcher = index.searcher()
    qs = iter(QUESTIONS * (repeat // len(QUESTIONS) + 1))

    def search() -> object:
        # Its query parser rejects some punctuation: the terms, space separated.
        q = index.parse_query(" ".join(query_terms(next(qs))), ["body"])
        return [searcher.doc(a)["doc"] for _, a in searcher.search(q, 8).hits]

    query = timed(search, repeat)
    samples = []
    for _ in range(5):
        index = build()
        t = time.perf_counter()
        writer = index.writer(15_000_000, 1)
        for n, p in enumerate(extra):
            writer.add_document(tantivy.Document(body=p.text, doc=len(ps) + n))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        samples.append(time.perf_counter() - t)
    return built, statistics.median(samples) * 1e3, query


def proxy_(ps: list[Passage], extra: list[Passage], repeat: int) -> tuple[float, float, float]:
    """The proxy's own BM25 (core/ranking.py)."""

    def build() -> Ranking:
        r = Ranking()
        r.add(p.text for p in ps)
        return r

    built = timed(build, 5)
    r = build()
    qs = iter(QUESTIONS * (repeat // len(QUESTIONS) + 1))
    query = timed(lambda: r.search(query_terms(next(qs)), 8), repeat)
    samples = []
    for _ in range(5):
        r2 = build()
        t = time.perf_counter()
        r2.add(p.text for p in extra)
        samples.append(time.perf_counter() - t)
    return built, statistics.median(samples) * 1e3, query


def bm25s_(ps: list[Passage], extra: list[Passage], repeat: int) -> tuple[float, float, float]:
    import bm25s  # type: ignore[import-untyped]  # no stubs; a candidate only

    def build(docs: list[Passage]) -> Any:
        r = bm25s.BM25()
        r.index([terms(p.text) for p in docs], show_progress=False)
        return r

    built = timed(lambda: build(ps), 5)
    r = build(ps)
    qs = iter(QUESTIONS * (repeat // len(QUESTIONS) + 1))
    query = timed(
        lambda: r.retrieve([query_terms(next(qs))], k=8, show_progress=False),
        repeat,
    )
    # No incremental add: the index of the archive with the new span is built again.
    added = timed(lambda: build(ps + extra), 5)
    return built, added, query


def rank_bm25_(ps: list[Passage], extra: list[Passage], repeat: int) -> tuple[float, float, float]:
    from rank_bm25 import BM25Okapi  # type: ignore[import-untyped]  # likewise

    built = timed(lambda: BM25Okapi([terms(p.text) for p in ps]), 5)
    r = BM25Okapi([terms(p.text) for p in ps])
    qs = iter(QUESTIONS * (repeat // len(QUESTIONS) + 1))
    query = timed(lambda: r.get_top_n(query_terms(next(qs)), ps, n=8), repeat)
    added = timed(lambda: BM25Okapi([terms(p.text) for p in ps + extra]), 5)
    return built, added, query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    ps = archive(args.tokens)
    extra = archive(args.tokens // 10)  # one compaction's newly covered span
    print(f"{len(ps)} passages for ~{args.tokens} tokens; add {len(extra)}")
    print(f"{'candidate':<10} {'build ms':>9} {'add ms':>8} {'query ms':>9}")
    for name, run in (
        ("ours", proxy_),
        ("tantivy", tantivy_),
        ("bm25s", bm25s_),
        ("rank-bm25", rank_bm25_),
    ):
        try:
            built, added, query = run(ps, extra, args.repeat)
        except ImportError:
            print(f"{name:<10} not installed")
            continue
        print(f"{name:<10} {built:9.2f} {added:8.2f} {query:9.3f}")


if __name__ == "__main__":
    main()
