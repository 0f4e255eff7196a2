"""How planning scales with history length: ``plan_compaction`` at 1k to 50k messages.

    python bench/plan_time.py [--repeats 7]

An agent history (system prompt, then rounds of user message, tool call, bulky tool
result and answer) whose target only its last rounds fit under, so the cut search runs
across nearly all of it, planned as a threshold compaction and as a forced one, from what
the count step hands the planner (token counts and ``view.result_flags``). Prints the
median time of each size and the 50k / 5k ratio, which is 10 for a linear planner (issue
11: within 10x). In-process, no servers; run by ``run.py`` into its Done-when table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from proxy.core.budget import Budget
from proxy.core.history import History, result_flags
from proxy.core.plan import plan_compaction
from proxy.core.view import View
from proxy.types import ChatMessage

SIZES = (1_000, 5_000, 10_000, 50_000)
_FRESH = View(covered=1, summary_tokens=0, elide_before=1)
_BUDGET = Budget(
    window=10**9,
    reserve=100,
    fixed=0,
    trigger=1000,
    target=3000,
    summary_allowance=100,
)


def agent_history(n: int) -> tuple[list[ChatMessage], list[int]]:
    messages: list[ChatMessage] = [{"role": "system", "content": "You are an agent."}]
    counts = [10]
    while len(messages) < n:
        i = len(messages)
        call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [call]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": f"c{i}", "content": "result " * 300},
            {"role": "assistant", "content": f"done {i}"},
        ]
        counts += [20, 20, 900, 20]
    return messages[:n], counts[:n]


def plan_ms(n: int, repeats: int) -> float:
    """Median ms of planning an ``n``-message history, threshold and forced."""
    messages, counts = agent_history(n)
    history = History(messages, [], counts, 1, 0, result_flags(messages))  # as counted
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for force in (False, True):
            plan = plan_compaction(history, _FRESH, _BUDGET, force=force)
            if plan.view.covered < 0.9 * n:
                raise RuntimeError(f"the cut search stopped early at {n} messages")
        times.append((time.perf_counter() - start) * 1000 / 2)
    return statistics.median(times)


def run(repeats: int) -> dict[str, Any]:
    ms = {str(n): plan_ms(n, repeats) for n in SIZES}  # str: JSON object keys
    return {"ms": ms, "ratio_50k_5k": ms["50000"] / ms["5000"], "repeats": repeats}


def table(result: dict[str, Any]) -> str:
    sizes = "  ".join(f"{int(n):>6} msgs {t:8.2f} ms" for n, t in result["ms"].items())
    return f"{sizes}  50k/5k {result['ratio_50k_5k']:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    print(table(run(parser.parse_args().repeats)))


if __name__ == "__main__":
    main()
