"""CPU per request at saturation: the lean floor, the proxy of another tree and this one's.

    python bench/cpu_per_request.py [--base DIR] [--rounds 12] [--seconds 2] [--spy PREFIX]
                                    [--connections 64]

Starts the fake upstream (CPU 0), ``passthrough_lean.py`` and the proxy (CPU 1; with
``--base``, also a second proxy importing ``proxy`` from DIR, e.g. a ``git archive`` of the
commit to compare with), then runs ``wrk -c64`` (``--connections``) against each in turn,
the order rotating every round, and reads each target's CPU time from ``/proc``: CPU µs per
request is what contention on a shared machine moves least (req/s moves most). Prints min,
first quartile and median per target, and the per-round ratios to the floor. ``--spy
PREFIX``: py-spy records each target during the last round (``PREFIX-<target>.raw``;
``spy_table.py`` reads them). Issue 27, bench/README.md "Where the time goes".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from loadgen import write_lua
from payloads import write_payloads
from targets import BENCH, UPSTREAM_KEEPALIVE_S, free_port

ROOT = BENCH.parent


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> tuple[float, float]:
    """CPU s of the threads other than the main one (the log writer's: py-spy's table
    leaves it out), in ns from schedstat; and the main thread's voluntary context
    switches (a wake-up from epoll, or a wait for the GIL: 0 while it is saturated)."""
    others = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if task.name != str(pid):
            with contextlib.suppress(OSError):
                others += int((task / "schedstat").read_text().split()[0]) / 1e9
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    found = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M)
    return others, float(found.group(1)) if found else 0.0


def _config(workdir: Path, upstream: int) -> Path:
    path = workdir / "proxy.yaml"
    path.write_text(
        f'upstream: {{base_url: "http://127.0.0.1:{upstream}/v1", api_key: "sk-bench",'
        f" keepalive_timeout_s: {UPSTREAM_KEEPALIVE_S}}}\n"
        'store: {url: "memory://"}\n'
        "default_model: {context_window: 1000000, max_output_tokens: 4096}\n"
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="a tree whose proxy/ to compare with")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--spy", help="py-spy raw files' prefix (last round)")
    parser.add_argument("--connections", type=int, default=64, help="wrk's -c")
    args = parser.parse_args()
    workdir = BENCH / "results" / "cpu"
    workdir.mkdir(parents=True, exist_ok=True)
    script = write_lua(write_payloads(workdir)["chat20"])
    procs, ports = start_targets(workdir, args.base)
    try:
        _rounds(ports, script, args)
    finally:
        stop(procs)


Procs = list[subprocess.Popen[bytes]]


def start_targets(
    workdir: Path, base: Path | None
) -> tuple[Procs, dict[str, tuple[subprocess.Popen[bytes], int]]]:
    """The fake upstream (CPU 0), the lean floor, this tree's proxy and, with ``base``, the
    proxy of that tree (CPU 1), each on a port of its own, given 6 s to listen; every
    process started, and each target's process and port. ``stop`` them when done."""
    upstream = free_port()
    py = sys.executable
    serve = [py, "-m", "proxy", "serve", "--config", str(_config(workdir, upstream))]
    commands = {"lean": ([py, str(BENCH / "passthrough_lean.py")], None), "new": (serve, ROOT)}
    if base is not None:
        commands["base"] = (serve, base.resolve())
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    fake = [py, str(BENCH / "fake_upstream.py"), "--port", str(upstream)]
    procs: Procs = [subprocess.Popen(["taskset", "-c", "0", *fake], **quiet)]
    ports: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, (cmd, tree) in commands.items():
            port = free_port()
            extra = ["--upstream", f"http://127.0.0.1:{upstream}/v1"] if name == "lean" else []
            env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
            full = ["taskset", "-c", "1", *cmd, "--host", "127.0.0.1", "--port", str(port)]
            procs.append(subprocess.Popen([*full, *extra], env=env, cwd="/tmp", **quiet))
            ports[name] = (procs[-1], port)
        time.sleep(6)
    except BaseException:
        stop(procs)
        raise
    return procs, ports


def stop(procs: Procs) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait()


def _rounds(
    ports: dict[str, tuple[subprocess.Popen[bytes], int]], script: Path, args: argparse.Namespace
) -> None:
    names = list(ports)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    threads: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(args.rounds + 1):  # round 0 warms up
        last = args.spy and r == args.rounds
        for name in names[r % len(names) :] + names[: r % len(names)]:
            proc, port = ports[name]
            spy = None
            if last:
                out = f"{args.spy}-{name}.raw"
                spy_exe = str(Path(sys.executable).with_name("py-spy"))
                rec = [spy_exe, "record", "--nonblocking", "-r", "1000", "-d", str(args.seconds)]
                spy = subprocess.Popen(
                    [*rec, "--format", "raw", "-o", out, "-p", str(proc.pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.3)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            wrk = [
                "wrk",
                "-t1",
                f"-c{args.connections}",
                f"-d{args.seconds}s",
                "-s",
                str(script),
                url,
            ]
            before, extra = _cpu_s(proc.pid), _threads(proc.pid)
            text = subprocess.run(["taskset", "-c", "0", *wrk], capture_output=True, text=True)
            after, extra_after = _cpu_s(proc.pid), _threads(proc.pid)
            if spy is not None:
                spy.wait()
            found = re.search(r"(\d+) requests in", text.stdout)
            if r and not last and found:
                n = int(found.group(1))
                cpu[name].append((after - before) / n * 1e6)
                threads[name].append(
                    ((extra_after[0] - extra[0]) / n * 1e6, (extra_after[1] - extra[1]) / n)
                )
    for name in names:
        v = sorted(cpu[name])
        q1, median = v[len(v) // 4], statistics.median(v)
        print(f"{name:5} CPU us/request: min {v[0]:.1f}  q1 {q1:.1f}  median {median:.1f}")
        other = statistics.median(t[0] for t in threads[name])
        waits = statistics.median(t[1] for t in threads[name])
        print(f"      of it other threads {other:.1f} us; main thread's waits {waits:.3f}/request")
    for name in names[1:]:
        ratios = sorted(f / p for f, p in zip(cpu["lean"], cpu[name], strict=True))
        low, high, median = ratios[0], ratios[-1], statistics.median(ratios)
        print(f"lean/{name} CPU per round: median {median:.2f} ({low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
