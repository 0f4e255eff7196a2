"""CPU per request of two or more proxy trees loaded at the same time, paired by round.

    python bench/cpu_side_by_side.py NAME=DIR NAME=DIR [...] [--rounds 20] [--seconds 2]
                                     [--connections 16]

Each ``DIR`` is a tree whose ``proxy/`` to serve (a ``git archive`` of a commit, or this
worktree), ``lean`` for ``passthrough_lean.py``. Each target gets a fake upstream of its
own (CPU 0) and is pinned to CPU 1 with the others; every round loads them all at once
(one ``wrk -c16`` each, on CPU 0) and reads each one's CPU time from ``/proc``. On a
machine shared with other benchmarks, the targets of one round see the same contention,
so the per-round difference to the first target is steadier than ``cpu_per_request.py``'s
rounds, which load one target at a time (the access line switched off: 20 of 20 rounds
lower, by 6-32 µs). Sharing a core, each target runs colder and dearer than alone:
compare differences, not levels, and start the targets in both orders (a process keeps
its start-up's luck, its memory layout, for its life: ±5 µs between launches).
Issue 27, bench/README.md "Saturation, session of 2026-11-26: the access line, third pass".
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cpu_per_request import _config, _cpu_s, stop
from loadgen import write_lua
from payloads import write_payloads
from targets import BENCH, free_port


def _start(workdir: Path, trees: dict[str, str]) -> tuple[list[subprocess.Popen[bytes]], dict]:
    py = sys.executable
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs: list[subprocess.Popen[bytes]] = []
    targets: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, tree in trees.items():
            upstream, port = free_port(), free_port()
            fake = [py, str(BENCH / "fake_upstream.py"), "--port", str(upstream)]
            procs.append(subprocess.Popen(["taskset", "-c", "0", *fake], **quiet))
            where = ["--host", "127.0.0.1", "--port", str(port)]
            env = None
            if tree == "lean":
                url = f"http://127.0.0.1:{upstream}/v1"
                cmd = [py, str(BENCH / "passthrough_lean.py"), *where, "--upstream", url]
            else:
                (workdir / name).mkdir(parents=True, exist_ok=True)
                config = _config(workdir / name, upstream)
                cmd = [py, "-m", "proxy", "serve", "--config", str(config), *where]
                env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            procs.append(
                subprocess.Popen(["taskset", "-c", "1", *cmd], env=env, cwd="/tmp", **quiet)
            )
            targets[name] = (procs[-1], port)
        time.sleep(6)
    except BaseException:
        stop(procs)
        raise
    return procs, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="NAME=DIR (DIR: a tree, or lean)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16, help="wrk's -c, each")
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.trees)
    workdir = BENCH / "results" / "side-by-side"
    workdir.mkdir(parents=True, exist_ok=True)
    script = write_lua(write_payloads(workdir)["chat20"])
    procs, targets = _start(workdir, trees)
    names = list(targets)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    try:
        for r in range(args.rounds + 1):  # round 0 warms up
            before = {name: _cpu_s(targets[name][0].pid) for name in names}
            loads = {}
            for name in names:
                url = f"http://127.0.0.1:{targets[name][1]}/v1/chat/completions"
                wrk = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s", "-s"]
                loads[name] = subprocess.Popen(
                    ["taskset", "-c", "0", *wrk, str(script), url],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            out = {name: load.communicate()[0] for name, load in loads.items()}
            for name in names:
                found = re.search(r"(\d+) requests in", out[name])
                if r and found:
                    used = _cpu_s(targets[name][0].pid) - before[name]
                    cpu[name].append(used / int(found.group(1)) * 1e6)
    finally:
        stop(procs)
    first = names[0]
    for name in names:
        diffs = [a - b for a, b in zip(cpu[name], cpu[first], strict=True)]
        print(
            f"{name:8} CPU us/request: median {statistics.median(cpu[name]):.1f}; "
            f"minus {first}'s, per round: median {statistics.median(diffs):+.1f}, "
            f"lower in {sum(d < 0 for d in diffs)} of {len(diffs)}"
        )


if __name__ == "__main__":
    main()
