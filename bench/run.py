"""Benchmark the proxy against the Python floor, on loopback, in one command.

    python bench/run.py [--quick] [--rounds N] [--targets a,b] [--scenarios x,y]

Starts the fake upstreams and every target, then runs each scenario for every target, ``rounds``
times, interleaving targets (their order rotates each round) so that noise on a shared machine
hits all of them alike. Figures are medians over rounds. Latencies are reported as *added*
latency: target minus ``direct`` (the fake upstream itself) at the same percentile in the same
round. Every figure also appears as a ratio against the baseline, ``passthrough-httpx``,
measured in the same run, and ``COMPARISONS`` adds ratios between other cells of the same run.
A scenario that names a session first has each of its proxy targets compact that session, and
the run checks (from the proxies' /metrics) that every measured request was served from the
snapshot. Prints a table; writes JSON to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import orjson
import plan_time
import precompact
from goals import as_json, goal_table, goals
from loadgen import ensure_wrk, measure_ttfb, run_load, write_lua
from payloads import PayloadName, write_payloads
from targets import (
    BASELINE,
    BENCH,
    DEFAULT_TARGETS,
    TARGETS,
    Fleet,
    ProxyCounters,
    Target,
    Upstream,
    pin_load_generation,
    unpin_load_generation,
)

Kind = Literal["latency", "throughput", "ttfb"]
Sample = dict[str, float]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One measurement, run against every target. Add a line to SCENARIOS to add one.

    ``session``: requests carry it as X-Session-Id, and each proxy target compacts it before
    the first round (``Fleet.warm``). ``targets``: run only these (and ``direct``, the floor);
    empty means every target that is not ``dedicated``.
    """

    name: str
    title: str
    kind: Kind
    payload: PayloadName
    connections: int = 1
    upstream: str = "fast"
    session: str = ""
    targets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Comparison:
    """A ratio of two medians of the same run: ``target`` in ``scenario`` over ``base_target``
    in ``base_scenario``, for each figure of the scenarios' kind."""

    title: str
    scenario: str
    target: str
    base_scenario: str
    base_target: str


UPSTREAMS = {"fast": Upstream("fast", 0), "slow50": Upstream("slow50", 50)}
SCENARIOS = (
    Scenario("chat_c1", "chat 20 msgs (8 KB), c=1", "latency", "chat20", 1),
    Scenario("chat_c16", "chat 20 msgs (8 KB), c=16", "latency", "chat20", 16),
    Scenario("saturation_c64", "chat 8 KB, saturation c=64", "throughput", "chat20", 64),
    Scenario("stream_ttfb", "streamed chat, TTFB, c=1", "ttfb", "chat20_stream"),
    Scenario("big_c1", "100k tokens (400 KB), c=1", "latency", "big100k", 1),
    Scenario("big_c4", "100k tokens (400 KB), c=4", "latency", "big100k", 4),
    Scenario("slow50_c64", "50 ms upstream, c=64", "throughput", "chat20", 64, "slow50"),
    Scenario(
        "warm_c1",
        "100k tokens, snapshot, c=1",
        "latency",
        "big100k",
        session="bench-warm-100k",
        targets=("proxy-compacting", "proxy-compacting-redis"),
    ),
    # A body the size of the view warm_c1 forwards: what moving those bytes costs by
    # itself, direct and through the floor, beside warm_c1's figure (goals.py).
    Scenario(
        "view_c1",
        "warm view's size (212 KB), c=1",
        "latency",
        "view100k",
        targets=("proxy", "passthrough-lean"),
    ),
    # saturation_c64 again, for one worker against two (dedicated: the rest would repeat it).
    Scenario(
        "workers_c64",
        "chat 8 KB, c=64, workers",
        "throughput",
        "chat20",
        64,
        targets=(BASELINE, "passthrough-aiohttp", "passthrough-lean", "proxy", "proxy-2-workers"),
    ),
)
COMPARISONS = (
    Comparison(
        "issue 3: warm 100k / proxy chat c=1", "warm_c1", "proxy-compacting", "chat_c1", "proxy"
    ),
    Comparison(
        "issue 3: warm 100k / pt-httpx chat c=1", "warm_c1", "proxy-compacting", "chat_c1", BASELINE
    ),
    Comparison(
        "issue 5: warm 100k, redis / memory",
        "warm_c1",
        "proxy-compacting-redis",
        "warm_c1",
        "proxy-compacting",
    ),
    Comparison(
        "workers: 2 / 1 at saturation", "workers_c64", "proxy-2-workers", "workers_c64", "proxy"
    ),
    Comparison(
        "workers: 2 / pt-aiohttp at saturation",
        "workers_c64",
        "proxy-2-workers",
        "workers_c64",
        "passthrough-aiohttp",
    ),
    Comparison(
        "workers: 2 / pt-lean at saturation",
        "workers_c64",
        "proxy-2-workers",
        "workers_c64",
        "passthrough-lean",
    ),
    # Issue 27: the proxy against the floor that counts where goals.py has no line for it, and
    # that floor against the earlier one.
    Comparison(
        "proxy / pt-lean, stream", "stream_ttfb", "proxy", "stream_ttfb", "passthrough-lean"
    ),
    Comparison("proxy / pt-lean, 400 KB c=1", "big_c1", "proxy", "big_c1", "passthrough-lean"),
    Comparison(
        "pt-lean / pt-aiohttp at saturation",
        "saturation_c64",
        "passthrough-lean",
        "saturation_c64",
        "passthrough-aiohttp",
    ),
)
# The figures each kind reports, each also as a ratio to the baseline.
FIGURES: dict[Kind, tuple[str, ...]] = {
    "latency": ("p50_added_ms", "p99_added_ms"),
    "throughput": ("rps",),
    "ttfb": ("ttfb_added_ms",),
}
_LABELS = {
    "p50_added_ms": "p50 +ms",
    "p99_added_ms": "p99 +ms",
    "rps": "req/s",
    "ttfb_added_ms": "TTFB +ms",
}


def _runs(scenario: Scenario, target: Target) -> bool:
    """Whether ``scenario`` measures ``target`` (see ``Scenario.targets``)."""
    if target.kind == "direct":
        return True
    if scenario.targets:
        return target.name in scenario.targets
    return not target.dedicated


@dataclass(frozen=True, slots=True)
class Options:
    rounds: int
    seconds: int
    ttfb_count: int
    targets: tuple[Target, ...]
    scenarios: tuple[Scenario, ...]
    output: Path
    precompact_turns: int  # 0: no pre-compaction scenario
    pin: bool  # one-worker targets on a CPU of their own, wrk and the upstream on the rest


def _measure(
    scenario: Scenario, url: str, payloads: dict[PayloadName, Path], wrk: str | None, opts: Options
) -> Sample:
    body = payloads[scenario.payload]
    if scenario.kind == "ttfb":
        return {"ttfb_ms": measure_ttfb(url, body, opts.ttfb_count), "errors": 0}
    result = run_load(wrk, url, body, scenario.connections, opts.seconds, scenario.session)
    return {
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "rps": result.rps,
        "requests": result.requests,
        "errors": result.errors,
    }


def _describe(sample: Sample) -> str:
    if "ttfb_ms" in sample:
        return f"TTFB {sample['ttfb_ms']:.3f} ms"
    text = (
        f"p50 {sample['p50_ms']:.3f} ms  p99 {sample['p99_ms']:.3f} ms  {sample['rps']:.0f} req/s"
    )
    return text + (f"  ERRORS {sample['errors']:.0f}" if sample["errors"] else "")


def _derive(sample: Sample | None, direct: Sample | None) -> Sample | None:
    """Add the figures relative to ``direct`` from the same round; None if either is unusable."""
    if sample is None or sample["errors"] or direct is None or direct["errors"]:
        return None
    derived = dict(sample)
    for raw in ("p50_ms", "p99_ms", "ttfb_ms"):
        if raw in sample:
            derived[raw.replace("_ms", "_added_ms")] = sample[raw] - direct[raw]
    if "rps" in sample and direct["rps"]:
        derived["rps_vs_direct"] = sample["rps"] / direct["rps"]
    return derived


def _median(values: Sequence[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


def _summarise(raw: dict[str, dict[str, list[Sample | None]]], opts: Options) -> dict[str, object]:
    out: dict[str, object] = {}
    for scenario in opts.scenarios:
        rounds = raw[scenario.name]
        ran = list(rounds)  # the available targets that run this scenario
        per_round: dict[str, list[Sample | None]] = {
            t: [_derive(s, d) for s, d in zip(rounds[t], rounds["direct"], strict=True)]
            for t in ran
        }
        medians: dict[str, dict[str, float | None]] = {}
        for t in ran:
            keys = sorted({k for s in per_round[t] if s for k in s})
            medians[t] = {k: _median([s[k] if s else None for s in per_round[t]]) for k in keys}
            medians[t]["errors"] = sum(s["errors"] for s in rounds[t] if s)
            medians[t]["valid_rounds"] = sum(1 for s in per_round[t] if s)
        base = medians.get(BASELINE, {})
        ratios = {
            t: {f: _ratio(medians[t].get(f), base.get(f)) for f in FIGURES[scenario.kind]}
            for t in ran
            if t not in ("direct", BASELINE)
        }
        out[scenario.name] = {
            **asdict(scenario),
            "medians": medians,
            "vs_baseline": ratios,
            "rounds": raw[scenario.name],
        }
    return out


def _compare(results: dict[str, object]) -> dict[str, object]:
    """Each comparison whose scenarios ran: per figure, both medians and their ratio."""
    out: dict[str, object] = {}
    for c in COMPARISONS:
        entry, base_entry = results.get(c.scenario), results.get(c.base_scenario)
        if not isinstance(entry, dict) or not isinstance(base_entry, dict):
            continue
        value = entry["medians"].get(c.target, {})
        base = base_entry["medians"].get(c.base_target, {})
        figures = {
            f: {
                "value": value.get(f),
                "base": base.get(f),
                "ratio": _ratio(value.get(f), base.get(f)),
            }
            for f in FIGURES[entry["kind"]]
        }
        out[c.title] = {**asdict(c), "figures": figures}
    return out


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _short(name: str) -> str:
    return name.replace("passthrough-", "pt-").replace("-compacting", "-cmp")


def _header(names: Sequence[str]) -> str:
    return f"{'scenario':<30}{'figure':<10}" + "".join(f"{_short(n):>18}" for n in names)


def _comparison_lines(comparisons: dict[str, object]) -> list[str]:
    lines = [
        "Ratios between cells of this run (value / base, both medians)",
        f"{'comparison':<40}{'figure':<10}{'value':>10}{'base':>10}{'ratio':>10}",
    ]
    for title, entry in comparisons.items():
        assert isinstance(entry, dict)
        for figure, cell in entry["figures"].items():
            digits = 0 if figure == "rps" else 3
            lines.append(
                f"{title:<40}{_LABELS[figure]:<10}{_fmt(cell['value'], digits):>10}"
                f"{_fmt(cell['base'], digits):>10}{_fmt(cell['ratio'], 2):>10}"
            )
    return lines


def _audit_notes(audit: dict[str, dict[str, object]]) -> list[str]:
    notes = []
    for name, a in audit.items():
        statuses = a.get("statuses")
        if not isinstance(statuses, dict):
            notes.append(f"ANOMALY {name}: could not read its counters: {a.get('error')}")
            continue
        others = {k: v for k, v in statuses.items() if k != "snapshot"}
        flag = "ANOMALY " if others or a["store_errors"] else ""
        counts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(statuses.items())) or "none"
        notes.append(
            f"{flag}{name}: warm-up said {a['warm_status']}; X-Compaction-Status while measured: "
            f"{counts} (wrk counted {a['measured_requests']:.0f}); "
            f"store errors {a['store_errors']:.0f}"
        )
    return notes


def _table(
    results: dict[str, object],
    opts: Options,
    unavailable: dict[str, str],
    comparisons: dict[str, object],
    audit: dict[str, dict[str, object]],
) -> str:
    names = [t.name for t in opts.targets]
    others = [n for n in names if n not in ("direct", BASELINE)]
    lines = [
        f"Medians of {opts.rounds} rounds (pt- = passthrough-, cmp = compacting; - = not run in "
        "this scenario). '+ms' is latency added over direct in the same round; the direct "
        "column shows its own absolute latency.",
        _header(names),
    ]
    ratio_lines = [
        f"Ratio to {BASELINE} (added latency: lower is better; req/s: higher is better)",
        _header(others),
    ]
    for scenario in opts.scenarios:
        entry = results[scenario.name]
        assert isinstance(entry, dict)
        medians, ratios = entry["medians"], entry["vs_baseline"]
        for figure in FIGURES[scenario.kind]:
            label = f"{scenario.title:<30}{_LABELS[figure]:<10}"
            cells = []
            for n in names:
                # Direct's added latency is zero by definition; show what it is measured from.
                key = figure.replace("_added", "") if n == "direct" else figure
                if n in medians:
                    flag = "*" if medians[n]["errors"] else ""
                    text = _fmt(medians[n].get(key), 0 if figure == "rps" else 3) + flag
                else:
                    text = "n/a" if n in unavailable else "-"
                cells.append(f"{text:>18}")
            lines.append(label + "".join(cells))
            ratio_cells = [
                f"{_fmt(ratios[n][figure], 2) if n in ratios else '-':>18}" for n in others
            ]
            ratio_lines.append(label + "".join(ratio_cells))
    flagged = any(
        isinstance(entry, dict) and any(m["errors"] for m in entry["medians"].values())
        for entry in results.values()
    )
    notes = ["* some rounds had errors and were left out of the median"] if flagged else []
    notes += [f"{name} unavailable: {reason}" for name, reason in unavailable.items()]
    notes += _audit_notes(audit)
    blocks = [lines, ratio_lines, _comparison_lines(comparisons) if comparisons else [], notes]
    return "\n\n".join("\n".join(block) for block in blocks if block)


def _parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s runs, 50 TTFB requests")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, help="length of each load run (default 4, quick 1)")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS))
    parser.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "latest.json")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not give the targets a CPU of their own (taskset) apart from wrk and the upstream",
    )
    parser.add_argument(
        "--precompact-turns",
        type=int,
        help="turns of precompact.py's agent run after the rounds (default 200, quick 80; 0: none)",
    )
    args = parser.parse_args(argv)
    by_target = {t.name: t for t in TARGETS}
    by_scenario = {s.name: s for s in SCENARIOS}
    wanted_targets = ["direct", BASELINE, *args.targets.split(",")]
    unknown = [n for n in wanted_targets if n not in by_target]
    unknown += [n for n in args.scenarios.split(",") if n not in by_scenario]
    unknown += [n for s in SCENARIOS for n in s.targets if n not in by_target]
    if unknown:
        parser.error(f"unknown targets or scenarios: {', '.join(unknown)}")
    targets = tuple(by_target[n] for n in dict.fromkeys(wanted_targets))
    scenarios = []
    for name in args.scenarios.split(","):
        scenario = by_scenario[name]
        if any(t.kind != "direct" and _runs(scenario, t) for t in targets):
            scenarios.append(scenario)
        else:
            print(f"skipping {name}: none of its targets is selected", flush=True)
    return Options(
        rounds=max(args.rounds, 1),
        seconds=args.seconds or (1 if args.quick else 4),
        ttfb_count=50 if args.quick else 200,
        targets=targets,
        scenarios=tuple(scenarios),
        output=args.output,
        pin=not args.no_pin,
        precompact_turns=(80 if args.quick else 200)
        if args.precompact_turns is None
        else args.precompact_turns,
    )


def _meta(opts: Options, wrk: str | None, started: float) -> dict[str, object]:
    wrk_version = None
    if wrk:
        probe = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=10)
        wrk_version = (probe.stdout or probe.stderr).splitlines()[0]
    git = ["git", "-C", str(BENCH), "describe", "--always", "--dirty"]
    head = subprocess.run(git, capture_output=True, text=True, timeout=10).stdout.strip()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": head or None,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "load_generator": wrk_version or "python aiohttp fallback",
        "rounds": opts.rounds,
        "seconds_per_run": opts.seconds,
        "ttfb_requests": opts.ttfb_count,
        "precompact_turns": opts.precompact_turns,
        "pinned": opts.pin,
        "baseline": BASELINE,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def _warm_up(fleet: Fleet, wrk: str | None, body: Path) -> None:
    """One second of load per server fills pools and caches; a server that fails it is dropped."""
    for (name, up_name), url in list(fleet.urls.items()):
        if name in fleet.unavailable:
            continue
        try:
            result = run_load(wrk, url, body, 16 if up_name == "fast" else 64, 1)
        except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
            fleet.drop(name, f"warm-up failed: {exc}")
            continue
        if result.errors and result.errors >= result.requests:
            fleet.drop(name, f"warm-up: {result.errors} errors, no successful request")


def _start(fleet: Fleet, opts: Options) -> None:
    """Each upstream, and in front of it every target that runs a scenario on it."""
    for up_name in dict.fromkeys(s.upstream for s in opts.scenarios):
        upstream = UPSTREAMS[up_name]
        port = fleet.start_upstream(upstream)
        scenarios = [s for s in opts.scenarios if s.upstream == up_name]
        for target in opts.targets:
            if target.kind != "direct" and any(_runs(s, target) for s in scenarios):
                fleet.start_target(target, upstream, port)


@dataclass(frozen=True, slots=True)
class _Warmed:
    scenario: Scenario
    target: str
    status: str  # X-Compaction-Status of the request that warmed it
    counters: ProxyCounters  # right after warming: the rounds are audited against these


def _warm_sessions(fleet: Fleet, opts: Options, payloads: dict[PayloadName, Path]) -> list[_Warmed]:
    """Compact each session scenario's conversation on its proxy targets, before any round."""
    warmed = []
    for scenario in (s for s in opts.scenarios if s.session):
        body = payloads[scenario.payload].read_bytes()
        for target in opts.targets:
            if target.kind != "proxy" or not _runs(scenario, target):
                continue
            if target.name in fleet.unavailable:  # did not start
                continue
            status = fleet.warm(target.name, scenario.upstream, body, scenario.session)
            if target.name not in fleet.unavailable:
                counters = fleet.counters(target.name, scenario.upstream)
                warmed.append(_Warmed(scenario, target.name, status, counters))
    return warmed


def _audit(
    fleet: Fleet, warmed: list[_Warmed], raw: dict[str, dict[str, list[Sample | None]]]
) -> dict[str, dict[str, object]]:
    """What the warm targets answered while measured: every request should say ``snapshot``."""
    audit: dict[str, dict[str, object]] = {}
    for w in warmed:
        samples = raw[w.scenario.name][w.target]
        entry: dict[str, object] = {
            "scenario": w.scenario.name,
            "warm_status": w.status,
            "measured_requests": sum(s["requests"] for s in samples if s),
        }
        try:
            delta = fleet.counters(w.target, w.scenario.upstream).since(w.counters)
            entry |= {"statuses": delta.statuses, "store_errors": delta.store_errors}
        except OSError as exc:
            entry["error"] = str(exc)
        audit[w.target] = entry
    return audit


def _rounds(
    fleet: Fleet,
    opts: Options,
    payloads: dict[PayloadName, Path],
    wrk: str | None,
    available: list[str],
) -> dict[str, dict[str, list[Sample | None]]]:
    """Every scenario for each of its targets, ``opts.rounds`` times; one sample (or None) each."""
    by_name = {t.name: t for t in opts.targets}
    lineups = {s.name: [n for n in available if _runs(s, by_name[n])] for s in opts.scenarios}
    raw: dict[str, dict[str, list[Sample | None]]] = {
        name: {t: [] for t in lineup} for name, lineup in lineups.items()
    }
    for r in range(opts.rounds):
        # Rotate the order each round so no target always runs first, or right after another.
        order = available[r % len(available) :] + available[: r % len(available)]
        for scenario in opts.scenarios:
            for name in (n for n in order if n in raw[scenario.name]):
                url = fleet.urls[name, scenario.upstream]
                tag = f"[round {r + 1}/{opts.rounds}] {scenario.name:<15} {name:<26}"
                sample: Sample | None = None
                try:
                    sample = _measure(scenario, url, payloads, wrk, opts)
                    print(f"{tag} {_describe(sample)}", flush=True)
                except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
                    print(f"{tag} FAILED {exc}", flush=True)
                raw[scenario.name][name].append(sample)
    return raw


def _fleet_rounds(
    fleet: Fleet, opts: Options, payloads: dict[PayloadName, Path], wrk: str | None
) -> tuple[dict[str, dict[str, list[Sample | None]]], dict[str, dict[str, object]], dict[str, str]]:
    """Start the targets, warm them, run the rounds: the samples, the warm audit and the
    targets that could not run."""
    _start(fleet, opts)
    _warm_up(fleet, wrk, payloads["chat20"])
    warmed = _warm_sessions(fleet, opts, payloads)
    unavailable = dict(fleet.unavailable)
    for name, reason in unavailable.items():
        print(f"UNAVAILABLE {name}: {reason}", flush=True)
    missing = [n for n in ("direct", BASELINE) if n in unavailable]
    if missing:
        raise SystemExit(f"cannot report ratios without {', '.join(missing)}")
    available = [t.name for t in opts.targets if t.name not in unavailable]
    raw = _rounds(fleet, opts, payloads, wrk, available)
    return raw, _audit(fleet, warmed, raw), unavailable


def run(opts: Options) -> dict[str, object]:
    started = time.monotonic()
    wrk = ensure_wrk()
    # Payloads, wrk scripts, proxy configs and server logs; kept after the run for inspection.
    workdir = opts.output.parent / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    payloads = write_payloads(workdir)
    for path in payloads.values():
        write_lua(path)
    for scenario in (s for s in opts.scenarios if s.session):
        write_lua(payloads[scenario.payload], scenario.session)
    chat, stream = payloads["chat20"].read_bytes(), payloads["chat20_stream"].read_bytes()
    target_cpu = pin_load_generation() if opts.pin else None
    print(f"targets pinned to CPU {target_cpu}" if target_cpu is not None else "not pinned")
    try:
        with Fleet(workdir, chat, stream, target_cpu=target_cpu) as fleet:
            raw, audit, unavailable = _fleet_rounds(fleet, opts, payloads, wrk)
    finally:
        if target_cpu is not None:
            unpin_load_generation()
    rows = None
    if opts.precompact_turns:
        # After every other server has stopped: its own simulator and proxies, alone.
        print(f"pre-compaction scenario: {opts.precompact_turns} turns per target", flush=True)
        ran = precompact.run(opts.precompact_turns, precompact.CHAT_MS, precompact.SUMMARY_MS)
        rows = [row.summary() for row in ran]
    plan = plan_time.run(repeats=7)
    results = _summarise(raw, opts)
    comparisons = _compare(results)
    found = goals(results, rows, plan)
    table = _table(results, opts, unavailable, comparisons, audit)
    if rows is not None:
        table += "\n\nPre-compaction scenario (bench/precompact.py)\n" + precompact.table(ran)
    return {
        "meta": _meta(opts, wrk, started),
        "targets": {
            t.name: {**asdict(t), "unavailable": unavailable.get(t.name)} for t in opts.targets
        },
        "scenarios": results,
        "comparisons": comparisons,
        "warm_audit": audit,
        "precompact": rows,
        "plan_time": plan,
        "done_when": as_json(found),
        "table": table + "\n\n" + goal_table(found),
    }


def main(argv: Sequence[str] | None = None) -> int:
    opts = _parse(argv)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process we started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report = run(opts)
    print()
    print(report["table"])
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    meta = report["meta"]
    assert isinstance(meta, dict)
    print(f"\nwrote {opts.output} ({meta['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; every server we started has been stopped", file=sys.stderr)
        sys.exit(130)
