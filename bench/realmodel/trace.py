"""Where each asked fact was in the prompt the model saw, from a ``run.py --capture`` run.

    python bench/realmodel/trace.py bench/realmodel/results/STAMP-0.5b-facts.json

For every proxy run (``proxy``, ``proxy-LABEL``) and every question it prints the answer,
whether it counted as recalled, and where the fact's value was in the request the proxy
sent llama-server for that question: ``verbatim`` (the planting message itself is in the
view), ``excerpt N/M`` (in the block of excerpts, which held M), ``proxy-text`` (in another
message the proxy wrote: the summary or the trimmed view's digest), or ``absent``. The
captured connections are matched to runs by the proxy port in each config's file name and
the run's planted messages (each seed plants its own), so it needs the ``run-STAMP``
directory beside the JSON.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenarios
import tap

EXCERPTS_START = "Verbatim excerpts of earlier turns"
ACK_START = "Noted: the excerpts above"
_EXCERPT_LINE = re.compile(r"^\[\w+ excerpt (\d+): [^\]]*\]$", re.MULTILINE)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _holds(fact: scenarios.Fact, text: str) -> bool:
    low = text.lower()
    return any(a.lower() in low for a in fact.accept)


def where(fact: scenarios.Fact, body: dict[str, Any], client: set[str]) -> str:
    """Where ``fact``'s value is in one chat request's messages."""
    places = []
    for message in body["messages"]:
        text = _text(message)
        if text == fact.plant:
            places.append("verbatim")
        elif text.startswith(EXCERPTS_START):
            heads = list(_EXCERPT_LINE.finditer(text))
            for n, head in enumerate(heads):
                end = heads[n + 1].start() if n + 1 < len(heads) else len(text)
                if _holds(fact, text[head.end() : end]):
                    places.append(f"excerpt {head.group(1)}/{len(heads)}")
            if not any(p.startswith("excerpt") for p in places):
                places.append(f"excerpts(0/{len(heads)})")
        elif text not in client and _holds(fact, text):
            places.append("proxy-text")
    if not any(p in ("verbatim", "proxy-text") or p.startswith("excerpt ") for p in places):
        places.append("absent")
    return ", ".join(places)


def main(path: Path) -> int:
    doc = json.loads(path.read_text())
    stamp = path.name.split("-", 1)[0]
    workdir = path.parent / f"run-{stamp}"
    # Every proxy config's port and its compaction settings.
    configs = {
        p.stem.rsplit("-", 1)[1]: json.loads(p.read_text()).get("compaction", {})
        for p in workdir.glob("proxy-*.yaml")
    }
    captured: dict[str, list[dict[str, Any]]] = {}
    for port in configs:
        prefix = next(iter(workdir.glob(f"upstream-*-{port}-c1.req")), None)
        if prefix is not None:
            stem = prefix.name.rsplit("-c1.req", 1)[0]
            captured[port] = [body for _, body in tap.messages(prefix.with_name(stem))]
    outcome: Counter[str] = Counter()
    for run in doc["runs"]:
        if not run["mode"].startswith("proxy") or run["scenario"] != "facts":
            continue
        by_kind = {f.kind: f for f in scenarios.facts(run["seed"])}
        plants = {f.plant for f in by_kind.values()}
        no_recall = run["mode"] != "proxy"  # the variants this bench plays turn recall off
        ports = [
            port
            for port, bodies in captured.items()
            if any(_text(m) in plants for b in bodies[:3] for m in b["messages"])
            and no_recall == ("recall_budget_ratio" in configs[port])
        ]
        if len(ports) != 1:
            print(f"{run['mode']} seed {run['seed']}: capture not found ({ports})")
            continue
        bodies = captured[ports[0]]
        client = client_texts(run, by_kind)
        row = next(r for r in doc["rows"] if (r["mode"], r["seed"]) == (run["mode"], run["seed"]))
        echoes = sum(1 for t in run["turns"] if t["answer"].startswith(ACK_START))
        print(
            f"\n## {run['mode']} seed {run['seed']} (port {ports[0]}): {row['recalled']}/"
            f"{row['asked']}, statuses {row['statuses']}, excerpt turns {row['excerpt_turns']}, "
            f"summaries {row['summary_calls']:g} (failed {row['summary_failures']:g}, "
            f"{row['summary_seconds']} s), outcomes {row['compaction_outcomes']}, summary "
            f"version {row['summary_version']}, answers echoing the acknowledgement {echoes}"
        )
        questions = [t for t in run["turns"] if t["phase"] == "question"]
        # recall_detail is filled in the order the questions were asked.
        for turn, kind in zip(questions, run["recall_detail"], strict=False):
            fact = by_kind[kind]
            body = next((b for b in bodies if _last(b) == fact.question), None)
            if body is None:
                print(f"- {kind}: no request with its question reached llama-server")
                continue
            place = where(fact, body, client)
            ok = "recalled" if turn["recalled"] else "MISSED"
            outcome[f"{run['mode']} {ok} {_first(place)}"] += 1
            print(
                f"- {kind} ({fact.phrasing}) {ok}: status {turn['status']}, "
                f"excerpts {turn['excerpts']}, value {fact.value!r} at: {place}; "
                f"answer {turn['answer'][:80]!r}"
            )
    print("\n" + "\n".join(f"{k}: {v}" for k, v in sorted(outcome.items())))
    return 0


def _first(place: str) -> str:
    """The place that could have given the answer: the view, an excerpt, the proxy's text."""
    for kind in ("verbatim", "excerpt ", "proxy-text"):
        if kind in place:
            return kind.strip()
    return "absent"


def _last(body: dict[str, Any]) -> str:
    return _text(body["messages"][-1]) if body["messages"] else ""


def client_texts(run: dict[str, Any], by_kind: dict[str, scenarios.Fact]) -> set[str]:
    """Every text the client sent in ``run``: the same draws as ``run.facts_script``."""
    rnd = random.Random(run["seed"])
    rnd.shuffle(list(by_kind.values()))
    texts = {scenarios.SYSTEM_PROMPT, *(t["answer"] for t in run["turns"])}
    texts |= {f.plant for f in by_kind.values()} | {f.question for f in by_kind.values()}
    texts |= {scenarios.filler(rnd) for _ in range(400)}
    return texts


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
