"""Does a huge uncounted history stall everyone else? Small requests while big ones arrive.

    python bench/stall.py [--rounds 3] [--small 300] [--quick]

Starts the fake upstream and two targets in front of it, as processes on loopback:
``passthrough-aiohttp`` (the minimal starlette + aiohttp relay, the baseline) and
``proxy-compacting`` (the proxy with a 120k window, so every ~110k-token request is counted
and compacted). For each target, interleaved over the rounds, one connection sends
``--small`` 20-message requests one after another, twice: alone, then while a second
connection sends ~400 KB histories back to back, each one new (a unique tag in every
message), so the proxy counts ~110k tokens it has never seen (~65 ms of tiktoken) and
summarizes them. Counting that much on the event loop would hold every small request
behind it; the proxy counts it in a worker thread.

Prints, per target, the small requests' p50/p99 alone and under the big ones (medians over
rounds), how many big requests were served, and the proxy's loaded p99 over the
passthrough's loaded p99 in the same run. Writes ``bench/results/stall.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from loadgen import request_headers
from payloads import build_payload
from targets import TARGETS, Fleet, Upstream, run_meta

RESULTS = Path(__file__).parent / "results" / "stall.json"
NAMES = ("passthrough-aiohttp", "proxy-compacting")
UPSTREAM = Upstream("instant", 0.0)


@dataclass(slots=True)
class Cell:
    """One target's small-request latencies (ms) per round, alone and under big requests."""

    alone_p50: list[float] = field(default_factory=list)
    alone_p99: list[float] = field(default_factory=list)
    loaded_p50: list[float] = field(default_factory=list)
    loaded_p99: list[float] = field(default_factory=list)
    big_served: list[int] = field(default_factory=list)
    errors: int = 0

    def medians(self) -> dict[str, float]:
        return {
            name: statistics.median(values)
            for name in ("alone_p50", "alone_p99", "loaded_p50", "loaded_p99", "big_served")
            if (values := getattr(self, name))
        }


def _p(ordered: list[float], pct: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct))]


class BigBodies:
    """~400 KB histories, each never seen before: a unique tag at the start of every message."""

    def __init__(self) -> None:
        self._base = orjson.loads(build_payload("big100k"))
        self._next = 0

    def next(self) -> bytes:
        self._next += 1
        body = dict(self._base)
        body["messages"] = [
            {**m, "content": f"[{self._next}.{i}] {m['content']}"}
            for i, m in enumerate(self._base["messages"])
        ]
        return orjson.dumps(body)


async def _small_run(http: aiohttp.ClientSession, url: str, body: bytes, count: int) -> list[float]:
    headers = request_headers()
    latencies: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        async with http.post(url, data=body, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"small request answered {resp.status}")
        latencies.append((time.perf_counter() - start) * 1000)
    return sorted(latencies)


async def _big_loop(url: str, bodies: BigBodies, stop: asyncio.Event) -> int:
    served = 0
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            body = await asyncio.to_thread(bodies.next)  # the client's own CPU, off its loop
            async with http.post(url, data=body, headers=request_headers()) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"big request answered {resp.status}")
            served += 1
    return served


async def _measure(url: str, small: bytes, count: int, bodies: BigBodies, cell: Cell) -> None:
    async with aiohttp.ClientSession() as http:
        await _small_run(http, url, small, 20)  # warm the connection and caches
        alone = await _small_run(http, url, small, count)
        stop = asyncio.Event()
        big = asyncio.create_task(_big_loop(url, bodies, stop))
        await asyncio.sleep(0.2)  # the first big request is in flight
        loaded = await _small_run(http, url, small, count)
        stop.set()
        served = await big
    cell.alone_p50.append(_p(alone, 0.5))
    cell.alone_p99.append(_p(alone, 0.99))
    cell.loaded_p50.append(_p(loaded, 0.5))
    cell.loaded_p99.append(_p(loaded, 0.99))
    cell.big_served.append(served)


def run(rounds: int, count: int) -> dict[str, Any]:
    cells = {name: Cell() for name in NAMES}
    small = build_payload("chat20")
    bodies = BigBodies()
    stream = build_payload("chat20_stream")
    with (
        tempfile.TemporaryDirectory(prefix="stall-") as tmp,
        Fleet(Path(tmp), small, stream) as fleet,
    ):
        upstream_port = fleet.start_upstream(UPSTREAM)
        for target in (t for t in TARGETS if t.name in NAMES):
            fleet.start_target(target, UPSTREAM, upstream_port)
        if fleet.unavailable:
            raise SystemExit(f"unavailable: {fleet.unavailable}")
        for r in range(rounds):
            order = NAMES if r % 2 == 0 else NAMES[::-1]
            for name in order:
                url = fleet.urls[name, UPSTREAM.name]
                asyncio.run(_measure(url, small, count, bodies, cells[name]))
                print(f"round {r + 1} {name}: {cells[name].medians()}", flush=True)
    medians = {name: cell.medians() for name, cell in cells.items()}
    base, proxy = medians[NAMES[0]], medians[NAMES[1]]
    return {
        "meta": run_meta(rounds=rounds, small_requests=count),
        "targets": medians,
        "loaded_p99_ratio": proxy["loaded_p99"] / base["loaded_p99"],
        "loaded_p50_ratio": proxy["loaded_p50"] / base["loaded_p50"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=300, help="small requests per phase")
    parser.add_argument("--quick", action="store_true", help="1 round of 150 small requests")
    opts = parser.parse_args()
    rounds, count = (1, 150) if opts.quick else (opts.rounds, opts.small)
    result = run(rounds, count)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(f"\n{'target':<22}{'alone p50/p99 ms':>20}{'loaded p50/p99 ms':>20}{'big served':>12}")
    for name, m in result["targets"].items():
        alone = f"{m['alone_p50']:.2f}/{m['alone_p99']:.2f}"
        loaded = f"{m['loaded_p50']:.2f}/{m['loaded_p99']:.2f}"
        print(f"{name:<22}{alone:>20}{loaded:>20}{m['big_served']:>12.0f}")
    print(
        f"proxy / passthrough under big requests: p50 {result['loaded_p50_ratio']:.2f}x, "
        f"p99 {result['loaded_p99_ratio']:.2f}x"
    )


if __name__ == "__main__":
    main()
