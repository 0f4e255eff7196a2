"""How well the classifier does on the corpus, family by family.

Prints (``pytest -s``, or ``python tests/upstream/test_overflow_matrix.py``) a table of every
provider family in ``tests/fixtures/overflow/cases.json`` with the expected kind against the
classified one, then asserts what the table is for: no negative is ever acted on, every
overflow and output budget is recognised with the limit it states, and every family the
issue names is present.
A case's family is its ``family`` field when set (sub-families such as Ollama's native and
OpenAI-compatible endpoints), else its ``provider``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, get_args

from proxy.upstream.overflow import OverflowKind, classify_error

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "overflow" / "cases.json").read_text(encoding="utf-8")
)
KINDS: tuple[OverflowKind, ...] = get_args(OverflowKind)
ACTED_ON = frozenset({"overflow", "output_budget"})

# Families the overflow issue names; each must have at least one real overflow answer.
LISTED_FAMILIES = frozenset(
    {
        "copilot",
        "dashscope",
        "moonshot",
        "zhipu",
        "ollama-native-chat",
        "ollama-openai-chat",
        "ollama-native-embed",
        "ollama-openai-embed",
        "llamacpp-derived",
        "bedrock-titan",
        "bedrock-characters",
    }
)


def family(case: dict[str, Any]) -> str:
    return str(case.get("family") or case["provider"])


def classified() -> list[tuple[dict[str, Any], OverflowKind, int | None]]:
    rows = []
    for case in CASES:
        verdict = classify_error(case["status"], case["headers"], case["body"].encode())
        rows.append((case, verdict.kind, verdict.limit))
    return rows


def render(rows: list[tuple[dict[str, Any], OverflowKind, int | None]]) -> str:
    """One line per family (expected kind -> classified kind counts), then the overall
    3x3 confusion matrix."""
    per_family: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    overall: Counter[tuple[str, str]] = Counter()
    for case, kind, _ in rows:
        pair = (case["expect"]["kind"], kind)
        per_family[family(case)][pair] += 1
        overall[pair] += 1

    def cell(counts: Counter[tuple[str, str]], expected: str) -> str:
        total = sum(n for (e, _), n in counts.items() if e == expected)
        right = counts[(expected, expected)]
        return f"{right}/{total}" if total else "-"

    header = (
        f"{'family':<22}{'cases':>6}{'overflow':>10}{'output_budget':>15}{'other':>8}{'wrong':>7}"
    )
    lines = [
        "Overflow classifier on tests/fixtures/overflow/cases.json",
        "(per kind: classified as expected / expected)",
        header,
        "-" * len(header),
    ]
    for name in sorted(per_family):
        counts = per_family[name]
        wrong = sum(n for (e, k), n in counts.items() if e != k)
        lines.append(
            f"{name:<22}{sum(counts.values()):>6}{cell(counts, 'overflow'):>10}"
            f"{cell(counts, 'output_budget'):>15}{cell(counts, 'other'):>8}{wrong:>7}"
        )
    lines.append("-" * len(header))
    total_wrong = sum(n for (e, k), n in overall.items() if e != k)
    lines.append(
        f"{'all':<22}{sum(overall.values()):>6}{cell(overall, 'overflow'):>10}"
        f"{cell(overall, 'output_budget'):>15}{cell(overall, 'other'):>8}{total_wrong:>7}"
    )
    lines += ["", "Confusion matrix (rows expected, columns classified):"]
    lines.append(f"{'':<16}" + "".join(f"{k:>15}" for k in KINDS))
    for expected in KINDS:
        lines.append(f"{expected:<16}" + "".join(f"{overall[(expected, k)]:>15}" for k in KINDS))
    false_positives = sum(n for (e, k), n in overall.items() if e == "other" and k in ACTED_ON)
    lines.append(
        f"false positives (a negative classified overflow/output_budget): {false_positives}"
    )
    return "\n".join(lines)


def test_confusion_matrix() -> None:
    rows = classified()
    print()
    print(render(rows))

    false_positives = [
        case["id"]
        for case, kind, _ in rows
        if case["expect"]["kind"] == "other" and kind != "other"
    ]
    assert not false_positives
    missed = [
        case["id"]
        for case, kind, _ in rows
        if case["expect"]["kind"] in ACTED_ON and kind != case["expect"]["kind"]
    ]
    assert not missed
    wrong_limit = [
        case["id"]
        for case, kind, limit in rows
        if case["expect"]["kind"] in ACTED_ON
        and case["expect"]["limit"] is not None
        and limit != case["expect"]["limit"]
    ]
    assert not wrong_limit


def test_every_listed_family_has_a_recognised_overflow() -> None:
    recognised = {
        family(case)
        for case, kind, _ in classified()
        if case["expect"]["kind"] == "overflow" and kind == "overflow"
    }
    assert not LISTED_FAMILIES - recognised


def test_the_corpus_has_negatives_of_every_sort() -> None:
    """Rate limits, auth, content policy and 5xx: each sort has answers that must stay other."""
    negatives = [case for case in CASES if case["expect"]["kind"] == "other"]
    statuses = Counter(case["status"] for case in negatives)
    assert statuses[429] >= 5  # rate limits
    assert statuses[413] >= 2  # Groq's per-minute budget
    assert statuses[401] + statuses[403] >= 1  # auth
    assert sum(n for status, n in statuses.items() if status >= 500) >= 4  # server errors
    policy = ("content", "inappropriate", "不安全", "responsibleai")
    assert sum(any(p in case["body"].lower() for p in policy) for case in negatives) >= 3


if __name__ == "__main__":
    print(render(classified()))
