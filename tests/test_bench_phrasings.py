"""The real-model bench's planted facts (bench/realmodel/phrasings.py, scenarios.py).

The bench measures the proxy's value rules on wordings they were not written for: its
held-out phrasings must not be quoted anywhere a rule or a unit test could be fitted to
them, and every kind of fact must come in several wordings, each recalled only by its value.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "realmodel"
# Long enough to be a phrasing's own words, short enough to catch a clause copied out of it.
NGRAM = 5


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # scenarios imports phrasings by this name
    spec.loader.exec_module(module)
    return module


phrasings = _load("phrasings")
scenarios = _load("scenarios")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def held_out_ngrams() -> dict[str, str]:
    """Every run of NGRAM words inside a held-out template (between its fields): template."""
    grams: dict[str, str] = {}
    for templates in phrasings.HELD_OUT.values():
        for template in templates:
            for piece in re.split(r"\{[a-z_]+\}", template):
                words = _words(piece)
                for i in range(len(words) - NGRAM + 1):
                    grams[" ".join(words[i : i + NGRAM])] = template
    return grams


def corpus() -> dict[Path, str]:
    """What a rule or a unit test is written in: proxy/ and tests/, this file aside."""
    files = [*ROOT.joinpath("proxy").rglob("*"), *ROOT.joinpath("tests").rglob("*")]
    out = {}
    for path in files:
        if path.suffix not in {".py", ".json", ".yaml", ".yml", ".txt", ".md", ".jsonl"}:
            continue
        if path.resolve() == Path(__file__).resolve() or "__pycache__" in path.parts:
            continue
        out[path] = " ".join(_words(path.read_text(errors="replace")))
    return out


def test_no_held_out_phrasing_is_quoted_in_the_proxy_or_the_tests() -> None:
    grams = held_out_ngrams()
    assert len(grams) > 40  # the check has something to look for
    quoted = [
        f"{path.relative_to(ROOT)}: {gram!r} (from {grams[gram]!r})"
        for path, text in corpus().items()
        for gram in grams
        if f" {gram} " in f" {text} "
    ]
    assert not quoted, "held-out bench phrasings quoted (write other words):\n" + "\n".join(quoted)


def test_every_kind_has_five_phrasings_some_held_out_and_three_questions() -> None:
    assert set(phrasings.PLANTS) == set(phrasings.HELD_OUT) == set(phrasings.KINDS)
    for kind in phrasings.KINDS:
        plants, held = phrasings.PLANTS[kind], phrasings.HELD_OUT[kind]
        assert len(plants) + len(held) >= 6, kind
        assert len(plants) >= 5, kind
        assert held, kind
        assert not set(plants) & set(held), kind
        assert len(phrasings.QUESTIONS[kind]) >= 3, kind


def test_every_phrasing_is_planted_by_some_seed_and_seeds_differ() -> None:
    seen: set[str] = set()
    for seed in range(1, 40):
        facts = scenarios.facts(seed)
        assert [f.kind for f in facts] == list(phrasings.KINDS)
        seen.update(f.phrasing for f in facts)
        assert facts == scenarios.facts(seed)  # the same seed replays the same words
    total = sum(len(phrasings.PLANTS[k]) + len(phrasings.HELD_OUT[k]) for k in phrasings.KINDS)
    assert len(seen) == total
    one, two, three = (scenarios.facts(seed) for seed in (1, 2, 3))
    for a, b, c in zip(one, two, three, strict=True):
        assert len({a.phrasing, b.phrasing, c.phrasing}) == 3, a.kind


@pytest.mark.parametrize("seed", range(1, 13))
def test_each_fact_is_planted_with_its_value_and_recalled_by_it_alone(seed: int) -> None:
    facts = scenarios.facts(seed)
    for fact in facts:
        assert fact.value in fact.plant, fact
        assert "{" not in fact.plant + fact.question, fact
        assert fact.held_out == ("/held-out/" in fact.phrasing)
        assert fact.recalled(f"It is {fact.value}.")
        assert not fact.recalled("I do not know.")
        for other in facts:
            if other.kind != fact.kind:
                assert not fact.recalled(other.value), (fact, other.value)


def test_an_amount_is_recalled_in_any_rendering_of_its_number() -> None:
    fact = scenarios.Fact("amount", "$37,500", "...", "?", scenarios.amount_renderings(37500))
    for answer in ("$37,500", "37500 dollars", "37 500", "USD 37,500", "37.5k", "37,5"):
        assert fact.recalled(answer) == (answer != "37,5"), answer
    assert not fact.recalled("$37")  # cut at the comma


def test_a_date_is_recalled_in_any_rendering() -> None:
    fact = scenarios.Fact("date", "2027-05-14", "...", "?", scenarios.date_renderings(5, 14))
    for answer in ("2027-05-14", "May 14, 2027", "14 May 2027", "May 14th", "05/14/2027"):
        assert fact.recalled(answer), answer
    assert not fact.recalled("May 15, 2027")
    assert not fact.recalled("2027-05-15")


def test_a_decision_is_not_recalled_by_its_rejected_option_first() -> None:
    fact = scenarios.Fact("decision", "NATS", "...", "?", ("NATS",), ("RabbitMQ",))
    assert fact.recalled("NATS")
    assert fact.recalled("NATS, not RabbitMQ")
    assert not fact.recalled("RabbitMQ")
    assert not fact.recalled("RabbitMQ (NATS was the other option)")


def test_a_proxy_variant_is_its_own_mode_on_top_of_the_shared_settings() -> None:
    run = _load("run")
    args = argparse.Namespace(
        reply_tokens=48,
        proxy_set=["compaction.summary_timeout_s=180", "model.precompact=false"],
        proxy_config_extra=["compaction: {recall_max_excerpts: 3}\nstore: {url: 'memory://'}"],
        proxy_variant=["no-recall:compaction.recall=false,compaction.recall_min_score=1.5"],
    )
    on = run.proxy_config(args, 4096, "http://127.0.0.1:9", "proxy")
    off = run.proxy_config(args, 4096, "http://127.0.0.1:9", "proxy-no-recall")
    assert on["compaction"] == {"recall_max_excerpts": 3, "summary_timeout_s": 180}
    assert off["compaction"] == {**on["compaction"], "recall": False, "recall_min_score": 1.5}
    assert on["models"][0]["precompact"] is False
    assert on["upstream"]["base_url"] == "http://127.0.0.1:9/v1"
    with pytest.raises(SystemExit):
        run.variants(["No Label:compaction.recall=false"])


def test_the_kind_table_counts_each_kind_over_the_seeds_and_the_held_out_ones() -> None:
    run = _load("run")
    rows = []
    for mode, p50 in (("direct", 2.0), ("proxy", 3.0)):
        for seed in (1, 2, 3):
            facts = scenarios.facts(seed)
            hits = {f.kind: mode == "proxy" and (f.kind != "date" or seed == 2) for f in facts}
            rows.append(
                {
                    "scenario": "facts",
                    "model": "0.5b",
                    "window": 4096,
                    "mode": mode,
                    "recalled": sum(hits.values()),
                    "asked": 8,
                    "p50_s": p50,
                    "per_kind": hits,
                    "held_out": [f.kind for f in facts if f.held_out],
                }
            )
    lines = run.kind_table(rows).splitlines()
    assert lines[0].split(" | ")[6:14] == list(phrasings.KINDS)
    proxy = lines[3].split(" | ")
    assert proxy[3:6] == ["proxy", "3", "7/8"]
    assert proxy[6:8] == ["3/3", "1/3"]  # person in every seed, the date in one
    assert proxy[-2:] == ["4/5", "1.5x |"]  # seed 3's held-out date missed
