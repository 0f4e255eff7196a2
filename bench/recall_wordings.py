"""Which planted facts recall's ranking finds, over every wording the real-model bench uses.

No model, no server: the facts scenario of ``bench/realmodel`` (its phrasings, questions
and filler, ``realmodel/scenarios.py``) is laid out as the archive a session would hold
(each turn split into passages as the proxy splits them, assistant turns in between), and
every question of every fact is asked of ``proxy/core/ranking.py`` the way recall asks it
(``query_terms``, ``search``, ``choose_excerpts`` with recall's floor and the window's
recall budget). Per kind, and for the held-out phrasings apart: how often the fact's own
passage is quoted, and how often another fact's passage is (a wrong value offered).

    python bench/recall_wordings.py [--seeds 40] [--window 4096]

A measurement of the ranking on wordings, not of a model: a fact quoted is one a reader
can answer from; what the model makes of it the real-model bench measures.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "realmodel")]

import phrasings  # noqa: E402
import scenarios  # noqa: E402

from proxy.compaction.recall import MAX_EXCERPTS, MIN_SCORE  # noqa: E402
from proxy.core.excerpts import Hit, choose_excerpts  # noqa: E402
from proxy.core.passages import Original, split_passages  # noqa: E402
from proxy.core.ranking import Ranking, query_terms  # noqa: E402

_ACKS = ("Got it, noted.", "Understood.", "Thanks, I will keep that in mind.", "Noted.")
_TIPS = (
    "Keep a short written guideline for {t} and review it each quarter.",
    "Pick one owner for {t} and write down the decisions.",
    "Start small with {t} and measure before changing more.",
)


def archive(seed: int, fillers: int) -> tuple[list[scenarios.Fact], list[Original]]:
    """One seed's facts, and the archive of its plant and filler turns with replies."""
    rnd = random.Random(seed)
    facts = scenarios.facts(seed)
    order = list(facts)
    rnd.shuffle(order)
    turns: list[tuple[str, str]] = []
    for f in order:
        turns += [("user", f.plant), ("assistant", rnd.choice(_ACKS))]
    for _ in range(fillers):
        text = scenarios.filler(rnd)
        topic = next(t for t in scenarios._TOPICS if t in text)
        turns += [("user", text), ("assistant", rnd.choice(_TIPS).format(t=topic))]
    return facts, [Original(i, role, text) for i, (role, text) in enumerate(turns)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--fillers", type=int, default=40, help="filler turns after the facts")
    args = ap.parse_args()
    budget = int(args.window * 0.1)
    found: Counter[str] = Counter()
    wrong: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    for seed in range(1, args.seeds + 1):
        facts, originals = archive(seed, args.fillers)
        passages = [p for o in originals for p in split_passages(o)]
        ranking = Ranking()
        ranking.add(p.text for p in passages)
        for fact in facts:
            others = [f.value for f in facts if f is not fact]
            for template in phrasings.QUESTIONS[fact.kind]:
                subject = next((d for d, _ in phrasings.DECISIONS if d in fact.plant), "")
                question = template.format(subject=subject)
                hits = [
                    Hit(score, passages[doc])
                    for score, doc in ranking.search(query_terms(question), MAX_EXCERPTS * 3)
                ]
                chosen = choose_excerpts(hits, MIN_SCORE, budget, MAX_EXCERPTS)
                group = ("held-out " if fact.held_out else "") + fact.kind
                for key in (group, "all"):
                    asked[key] += 1
                    found[key] += any(fact.value in p.text for p in chosen)
                    wrong[key] += any(v in p.text for p in chosen for v in others)
    print(f"seeds {args.seeds}, window {args.window} (budget {budget}), fillers {args.fillers}")
    print(f"{'kind':<20} {'asked':>6} {'quoted':>7} {'other fact quoted':>18}")
    for key in sorted(asked, key=lambda k: (k == "all", k.startswith("held"), k)):
        n = asked[key]
        print(f"{key:<20} {n:>6} {found[key] / n:>7.0%} {wrong[key] / n:>18.0%}")


if __name__ == "__main__":
    main()
