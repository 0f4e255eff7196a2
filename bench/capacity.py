"""What one compacted session costs: Redis bytes and proxy process memory, measured.

    python bench/capacity.py [--sessions 2000] [--facts 100] [--stores memory,redis]

For each store it starts the simulator, a redis-server (for ``redis``) and the proxy
(``compaction-proxy serve``, one worker) as processes on loopback. Every session is one
request whose history is over the model's window (``--window``, 4k), so the proxy
summarizes it inline and stores one snapshot and one sighting: what a session leaves. ``--facts``
planted ``FACT key=value`` lines per session set the summary's size (the simulator's ideal
summarizer lists every fact; 100 facts make about 5.5 KB, the size the issue measured).

After a warm-up of 50 sessions (imports, pools, first allocations) it reads the proxy's
resident memory (``VmRSS`` of the process) and Redis's ``used_memory``, plays
``--sessions`` more sessions, 16 at a time, and reads them again. Prints, per store:
sessions, mean stored snapshot bytes (Redis ``HSTRLEN``), Redis bytes per session, proxy
RSS per session, and MiB per 10k sessions. RSS only grows by what the allocator keeps, so
per-session figures from a few thousand sessions are what capacity planning needs:
``max_sessions`` x per-session + the base. Writes ``bench/results/capacity.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis
from retention import _free_port, serve

RESULTS = Path(__file__).parent / "results" / "capacity.json"
WARMUP = 50
CONCURRENCY = 16
FILLER = "The deployment notes repeat here so that the history runs past the window. " * 12


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmRSS for pid {pid}")


@contextmanager
def _redis(workdir: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def _servers(store_url: str, window: int, workdir: Path) -> Iterator[tuple[str, int]]:
    # The simulator's window is larger: it summarizes whatever the proxy sends.
    sim = f'models: [{{match: "bench-*", context_window: {window * 4}, max_output_tokens: 4096}}]\n'
    proxy = (
        f'store: {{url: "{store_url}"}}\n'
        "models:\n"
        f'  - {{match: "bench-*", context_window: {window}, max_output_tokens: 256, '
        "precompact: false}\n"
        "compaction: {summary_budget_ratio: 0.4}\n"
    )
    with serve(workdir / "servers", sim, proxy) as running:
        yield running


def _history(session: int, facts: int, window: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant. Keep every value."}]
    for i in range(facts):
        messages.append(
            {"role": "user", "content": f"FACT s{session}_key{i}=value-{session:06d}-{i:04d}"}
        )
        messages.append({"role": "assistant", "content": f"Noted {i}."})
    for i in range(window // 300):  # ~170 tokens each: the history runs past the window
        messages.append({"role": "user", "content": f"Turn {i}: {FILLER}"})
        messages.append({"role": "assistant", "content": f"Done {i}."})
    messages.append({"role": "user", "content": "What now?"})
    return messages


async def _play(url: str, first: int, count: int, args: argparse.Namespace) -> int:
    """Sessions ``first`` .. ``first + count - 1``, one request each; returns failures."""
    limit = asyncio.Semaphore(CONCURRENCY)
    failures = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:

        async def one(session: int) -> None:
            nonlocal failures
            body = {
                "model": "bench-capacity",
                "messages": _history(session, args.facts, args.window),
            }
            headers = {"Authorization": "Bearer sk-cap", "X-Session-Id": f"cap-{session}"}
            async with limit:
                r = await http.post("/v1/chat/completions", json=body, headers=headers)
            if r.status_code != 200 or "compacted" not in r.headers.get("x-compaction-status", ""):
                failures += 1

        await asyncio.gather(*(one(s) for s in range(first, first + count)))
    return failures


def _measure(store: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sessions = args.sessions
    with (
        _maybe_redis(store, workdir) as store_url,
        _servers(store_url, args.window, workdir) as (url, pid),
    ):
        failures = asyncio.run(_play(url, 0, WARMUP, args))
        client = redis.Redis.from_url(store_url) if store == "redis" else None
        rss0 = _rss_bytes(pid)
        used0 = int(client.info("memory")["used_memory"]) if client else 0
        started = time.monotonic()
        half = sessions // 2
        failures += asyncio.run(_play(url, WARMUP, half, args))
        rss_half = _rss_bytes(pid)
        failures += asyncio.run(_play(url, WARMUP + half, sessions - half, args))
        seconds = time.monotonic() - started
        time.sleep(1)  # background writes (sightings) land
        rss = _rss_bytes(pid)
        row: dict[str, Any] = {
            "store": store,
            "sessions": sessions,
            "failures": failures,
            "seconds": round(seconds, 1),
            "rss_base_mib": rss0 / 2**20,
            "rss_per_session": (rss - rss0) / sessions,
            # The second half alone: what one more session costs once the heap has grown.
            "rss_per_session_late": (rss - rss_half) / (sessions - half),
        }
        if client is not None:
            used = int(client.info("memory")["used_memory"]) - used0
            snaps = [k for k in client.scan_iter("cp:snap:*", count=1000)]
            lengths = [int(client.hstrlen(k, "d")) for k in snaps[:500]]
            row["redis_keys"] = int(client.dbsize())
            row["snapshot_bytes"] = sum(lengths) / max(len(lengths), 1)
            row["redis_per_session"] = used / sessions
        return row


@contextmanager
def _maybe_redis(store: str, workdir: Path) -> Iterator[str]:
    if store == "redis":
        with _redis(workdir) as url:
            yield url
    else:
        yield "memory://"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--facts", type=int, default=100)
    parser.add_argument("--stores", default="memory,redis")
    parser.add_argument("--window", type=int, default=4096, help="the model's, in tokens")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores.split(","):
            rows.append(_measure(store, args, Path(tmp)))
    print(
        f"{'store':8} {'sessions':>8} {'failed':>6} {'snapshot B':>10} {'redis B/s':>10} "
        f"{'base MiB':>8} {'RSS B/s':>9} {'late B/s':>9} {'RSS MiB/10k':>11}"
    )
    for row in rows:
        print(
            f"{row['store']:8} {row['sessions']:>8} {row['failures']:>6} "
            f"{row.get('snapshot_bytes', 0):>10.0f} {row.get('redis_per_session', 0):>10.0f} "
            f"{row['rss_base_mib']:>8.0f} {row['rss_per_session']:>9.0f} "
            f"{row['rss_per_session_late']:>9.0f} {row['rss_per_session'] * 10_000 / 2**20:>11.1f}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(
        orjson.dumps(
            {"facts": args.facts, "window": args.window, "rows": rows}, option=orjson.OPT_INDENT_2
        )
    )


if __name__ == "__main__":
    main()
