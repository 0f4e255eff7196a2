"""System calls per request at load: the lean floor, this tree's proxy and another tree's.

    python bench/syscalls_per_request.py [--base DIR] [--seconds 3] [--connections 16]

Starts the fake upstream (CPU 0), ``passthrough_lean.py`` and the proxy (CPU 1; with
``--base``, also a proxy importing ``proxy`` from DIR, e.g. a ``git archive`` of a commit),
then for each in turn attaches ``strace -c -f`` while ``wrk -c16`` (``--connections``) runs,
and prints each system call made more than once every 20 requests, per request. strace
slows the target down, but counts are what it measures, not time: a deterministic figure
where CPU time on a shared machine is not (bench/README.md, "Saturation, session of 2026-11-26").
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from pathlib import Path

from cpu_per_request import start_targets, stop
from loadgen import write_lua
from payloads import write_payloads
from targets import BENCH

ROOT = BENCH.parent
_QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


def _count(
    pid: int, url: str, script: Path, args: argparse.Namespace, out: Path
) -> dict[str, float]:
    conns = f"-c{args.connections}"
    subprocess.run(["wrk", "-t1", conns, "-d1s", "-s", str(script), url], capture_output=True)
    strace = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(pid)], **_QUIET)
    time.sleep(0.5)
    wrk = ["wrk", "-t1", conns, f"-d{args.seconds}s", "-s", str(script), url]
    text = subprocess.run(wrk, capture_output=True, text=True).stdout
    strace.send_signal(2)
    strace.wait()
    found = re.search(r"(\d+) requests in", text)
    requests = int(found.group(1)) if found else 0
    calls: dict[str, float] = {}
    for line in out.read_text().splitlines()[2:]:
        parts = line.split()
        if requests and len(parts) >= 5 and parts[3].isdigit():
            calls[parts[-1]] = int(parts[3]) / requests
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="a tree whose proxy/ to compare with")
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16, help="wrk's -c")
    args = parser.parse_args()
    workdir = BENCH / "results" / "syscalls"
    workdir.mkdir(parents=True, exist_ok=True)
    script = write_lua(write_payloads(workdir)["chat20"])
    procs, ports = start_targets(workdir, args.base)
    try:
        counts = {
            name: _count(proc.pid, url, script, args, workdir / f"{name}.strace")
            for name, (proc, port) in ports.items()
            for url in [f"http://127.0.0.1:{port}/v1/chat/completions"]
        }
    finally:
        stop(procs)
    names = sorted({c for calls in counts.values() for c, n in calls.items() if n >= 0.05})
    print(" | ".join(["system call", *counts]))
    for call in names:
        print(" | ".join([call, *(f"{calls.get(call, 0.0):.2f}" for calls in counts.values())]))


if __name__ == "__main__":
    main()
