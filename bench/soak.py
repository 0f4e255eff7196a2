"""The soak of issue 13, long: ``tests/support/soaking.py`` (the engine ``tests/e2e/test_soak.py``
runs short in CI) with the load the issue names, on each store, then 500 idle
connections.

    python bench/soak.py [--sessions 200] [--turns 50] [--waves 15] [--stores memory,redis]
                         [--max-sessions 1000] [--seconds 1800] [--idle 500] [--quick]

For each store (``memory``; ``redis``: a redis-server the run starts on 127.0.0.1) it
starts the simulator and the proxy as processes and plays ``--sessions``
conversations of ``--turns`` turns at once (every other turn streamed, ~100 tokens a
turn in a 4k window: compaction, inline and in the background, every ~10 turns),
``--waves`` times with new sessions, so the proxy's bounded state fills up:
``--max-sessions`` (the store's ``max_sessions``) and the token counts it caches per
message (200,000). No turn starts after ``--seconds``. Then ``--idle`` connections
that sent part of a request head, or nothing, are held while 200 requests are timed.

Prints per store: turns, failures, lost messages, summaries against stored versions,
compactions, latency, the proxy's RSS every tenth of the run, its rise over the last
third, and the idle-connection latencies. Writes ``bench/results/soak.json``. Exits 1
if any invariant (``tests/support/soaking.py``) failed.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.soaking import Config, Fleet, IdleReport, Report, idle_connections, soak

RESULTS = Path(__file__).parent / "results" / "soak.json"


def _print_report(report: Report) -> None:
    c = report.config
    ordered = sorted(report.latencies_ms) or [0.0]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"\n[{c.store}] {report.turns_done} turns ({c.sessions} sessions x {c.turns} turns x "
        f"{c.waves} waves, {report.streamed} streamed) in {report.seconds:.0f} s; "
        f"{report.failed} failed, {report.lost} lost, "
        f"{report.version_regressions} versions went back"
    )
    print(
        f"  compaction: {report.summaries} summaries written, {report.versions} versions "
        f"stored, {report.sessions_compacted} sessions compacted; statuses "
        f"{dict(report.statuses)}"
    )
    print(f"  latency per turn: p50 {statistics.median(ordered):.0f} ms, p99 {p99:.0f} ms")
    print("  RSS of the proxy: " + ", ".join(f"{kb // 1024}" for _, _, kb in report.rss_table()))
    print(f"  (MB, every tenth of the turns); rise in the last third: {report.rss_growth_kb} KB")
    for problem in report.problems():
        print(f"  PROBLEM: {problem}")


def _print_idle(idle: IdleReport) -> None:
    print(
        f"  {idle.held} idle connections held ({idle.open_while_measured} still open "
        f"after): {idle.requests} requests p50/p99 {idle.held_ms[0]:.1f}/{idle.held_ms[1]:.1f} ms "
        f"(without: {idle.baseline_ms[0]:.1f}/{idle.baseline_ms[1]:.1f} ms), "
        f"{idle.failed} failed"
    )
    for problem in idle.problems():
        print(f"  PROBLEM: {problem}")


def _summary(report: Report, idle: IdleReport) -> dict[str, Any]:
    out = asdict(report)
    out.pop("latencies_ms")
    out["statuses"] = dict(report.statuses)  # orjson writes no dict subclass
    ordered = sorted(report.latencies_ms) or [0.0]
    out["p50_ms"] = statistics.median(ordered)
    out["p99_ms"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    out["rss_rise_last_third_kb"] = report.rss_growth_kb
    out["rss_table"] = report.rss_table()
    out["idle"] = asdict(idle)
    out["problems"] = report.problems() + idle.problems()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--waves", type=int, default=15)
    parser.add_argument("--stores", default="memory,redis")
    parser.add_argument("--max-sessions", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1800)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="2 waves")
    args = parser.parse_args(argv)
    base = Config(
        sessions=args.sessions,
        turns=args.turns,
        waves=2 if args.quick else args.waves,
        max_sessions=args.max_sessions,
        seconds=args.seconds,
    )
    started = time.monotonic()
    results, failed = [], False
    for store in args.stores.split(","):
        config = replace(base, store=store)
        with tempfile.TemporaryDirectory(prefix=f"soak-{store}-") as tmp:
            report = soak(config, Path(tmp))
            _print_report(report)
            with Fleet(store, Path(tmp)) as fleet:
                idle = idle_connections(fleet.url, count=args.idle)
            _print_idle(idle)
        results.append(_summary(report, idle))
        failed = failed or bool(results[-1]["problems"])
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(
        orjson.dumps(
            {
                "date": datetime.now(UTC).isoformat(timespec="minutes"),
                "machine": f"{platform.system()} {platform.release()} {platform.machine()}",
                "python": platform.python_version(),
                "seconds": round(time.monotonic() - started),
                "args": vars(args),
                "runs": results,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
