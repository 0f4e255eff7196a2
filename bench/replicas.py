"""Two replicas behind one Redis against one: warm 100k-token sessions, req/s and added p50.

    python bench/replicas.py [--rounds 3] [--seconds 4] [--connections 4]

Starts the fake upstream, a redis-server and two ``proxy-compacting-redis`` replicas (the
proxy with a 120k window and its snapshots in that Redis), as processes on loopback. Two
sessions are compacted once through replica 1, and served from their snapshots by replica 2
on its first request: the replicas share them. Then, interleaved over the rounds,
``--connections`` keep-alive connections, half on each session (two wrk processes), send
their session's ~400 KB history:

- ``direct``: to the fake upstream itself, the floor for the added latency;
- ``one replica``: all of them to replica 1;
- ``two replicas``: one session's to each (a load balancer of no cost).

Prints medians over rounds: req/s, p50, and added p50 (over ``direct``), two against one,
and the Redis round trips per request: redis-server's ``HMGET`` calls (the snapshot read;
every other command rides in the same pipeline or runs off the request path) over requests
served. On two cores the replicas, wrk, the upstream and Redis share both: the two-replica
figure shows what sharing sessions through Redis costs, not how far replicas scale on
machines with free cores. Writes ``bench/results/replicas.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import redis
from loadgen import LoadResult, ensure_wrk, run_load, write_lua
from payloads import build_payload, write_payloads
from targets import TARGETS, Fleet, Upstream, run_meta

RESULTS = Path(__file__).parent / "results" / "replicas.json"
UPSTREAM = Upstream("instant", 0.0)
BASE = next(t for t in TARGETS if t.name == "proxy-compacting-redis")
REPLICAS = (replace(BASE, name="replica-1"), replace(BASE, name="replica-2"))
CELLS = ("direct", "one replica", "two replicas")


def _load(jobs: list[tuple[str, str]], body: Path, connections: int, seconds: int) -> LoadResult:
    """``connections`` split over ``jobs`` (url, session), run at once and summed."""
    wrk = ensure_wrk()
    each = max(connections // len(jobs), 1)
    with ThreadPoolExecutor(len(jobs)) as pool:
        runs = list(pool.map(lambda job: run_load(wrk, job[0], body, each, seconds, job[1]), jobs))
    return LoadResult(
        requests=sum(r.requests for r in runs),
        errors=sum(r.errors for r in runs),
        rps=sum(r.rps for r in runs),
        p50_ms=statistics.mean(r.p50_ms for r in runs),
        p99_ms=max(r.p99_ms for r in runs),
    )


def _hmget_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


def run(rounds: int, seconds: int, connections: int) -> dict[str, Any]:
    figures: dict[str, dict[str, list[float]]] = {c: {} for c in CELLS}
    chat, stream = build_payload("chat20"), build_payload("chat20_stream")
    with (
        tempfile.TemporaryDirectory(prefix="replicas-") as tmp,
        Fleet(Path(tmp), chat, stream) as fleet,
    ):
        body = write_payloads(Path(tmp))["big100k"]
        names = ["bench-replicas-a", "bench-replicas-b"]
        for name in ("", *names):
            write_lua(body, name)
        upstream_port = fleet.start_upstream(UPSTREAM)
        for target in REPLICAS:
            fleet.start_target(target, UPSTREAM, upstream_port)
        if fleet.unavailable:
            raise SystemExit(f"unavailable: {fleet.unavailable}")
        urls = [fleet.urls[t.name, UPSTREAM.name] for t in REPLICAS]
        for name in names:
            fleet.warm(REPLICAS[0].name, UPSTREAM.name, body.read_bytes(), name)
            # Replica 2 never compacted it: a snapshot answer is one it read from Redis.
            if fleet.warm(REPLICAS[1].name, UPSTREAM.name, body.read_bytes(), name) != "snapshot":
                raise SystemExit(f"replica 2 did not find session {name}'s snapshot in Redis")
        client = redis.Redis.from_url(fleet.store_url("redis"))
        direct = fleet.urls["direct", UPSTREAM.name]
        plans = {
            "direct": [(direct, "")],
            "one replica": [(urls[0], name) for name in names],
            "two replicas": list(zip(urls, names, strict=True)),
        }
        for r in range(rounds):
            for cell in CELLS[r % 3 :] + CELLS[: r % 3]:
                before = _hmget_calls(client)
                result = _load(plans[cell], body, connections, seconds)
                reads = _hmget_calls(client) - before
                row = figures[cell]
                for key, value in (("rps", result.rps), ("p50_ms", result.p50_ms)):
                    row.setdefault(key, []).append(value)
                if cell != "direct":
                    row.setdefault("redis_reads_per_request", []).append(
                        reads / max(result.requests, 1)
                    )
                row.setdefault("errors", []).append(result.errors)
                print(f"round {r + 1} {cell}: {result}", flush=True)
    return _summary(figures, rounds, seconds, connections)


def _summary(
    figures: dict[str, dict[str, list[float]]], rounds: int, seconds: int, connections: int
) -> dict[str, Any]:
    medians = {
        cell: {k: statistics.median(v) for k, v in row.items()} for cell, row in figures.items()
    }
    floor = medians["direct"]["p50_ms"]
    for cell in CELLS[1:]:
        medians[cell]["p50_added_ms"] = medians[cell]["p50_ms"] - floor
    one, two = medians["one replica"], medians["two replicas"]
    return {
        "meta": run_meta(rounds=rounds, seconds=seconds, connections=connections),
        "cells": medians,
        "two_over_one_rps": two["rps"] / one["rps"],
        "two_over_one_added_p50": two["p50_added_ms"] / one["p50_added_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=4)
    args = parser.parse_args()
    out = run(args.rounds, args.seconds, args.connections)
    for cell, row in out["cells"].items():
        print(f"{cell:14} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print(
        f"two replicas / one: req/s {out['two_over_one_rps']:.2f}, "
        f"added p50 {out['two_over_one_added_p50']:.2f}"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
