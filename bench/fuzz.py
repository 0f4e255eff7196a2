"""The request fuzzer of tests/e2e/test_fuzz.py, for longer than CI runs it.

    python bench/fuzz.py [--examples 20000] [--seconds 600] [--seed 0]

Starts the simulator and one proxy in this process (as the tests do), then sends
the requests ``tests/support/fuzzing.py`` generates, raw on their own sockets, in batches
of ``--batch`` hypothesis examples with the seeds ``seed``, ``seed + 1``, ... until
``--examples`` have run or ``--seconds`` have passed (checked between batches).
Each answer must come within 15 s, never be a 5xx, and be OpenAI-shaped when the
proxy wrote it; ``/healthz`` is checked after every batch. The first failure stops
the run and prints the request that caused it (shrunk). Prints cases, time and the
answers by status.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.simulator import create_simulator_app, load_simulator_config
from tests.support import fuzzing
from tests.support.servers import proxy_settings, run_proxy, run_server

HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def run_batch(address: tuple[str, int], size: int, batch_seed: int, answers: Counter[int]) -> None:
    @seed(batch_seed)
    @settings(
        max_examples=size,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=fuzzing.requests())
    def batch(request: bytes) -> None:
        answer = fuzzing.exchange(address, request)
        try:
            fuzzing.check(answer)
        except AssertionError:
            print(f"\nfailing request ({len(request)} bytes):\n{request[:2000]!r}")
            raise
        answers[answer.status] += 1

    batch()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # refused requests are logged by design

    answers: Counter[int] = Counter()
    started = time.monotonic()
    batches = 0
    with run_server(create_simulator_app(load_simulator_config(None))) as sim:
        config = proxy_settings(sim, **fuzzing.PROXY_CONFIG)
        with run_proxy(config) as url:
            host, port = url.removeprefix("http://").split(":")
            address = (host, int(port))
            while sum(answers.values()) < args.examples:
                if time.monotonic() - started > args.seconds:
                    break
                size = min(args.batch, args.examples - sum(answers.values()))
                try:
                    run_batch(address, size, args.seed + batches, answers)
                except Exception as exc:
                    print(f"FAILED in batch {batches} (seed {args.seed + batches}): {exc!r}")
                    return 1
                batches += 1
                health = fuzzing.exchange(address, HEALTH, 5)
                if health.status != 200:
                    print(f"FAILED: /healthz answered {health.status} after batch {batches}")
                    return 1
                elapsed = time.monotonic() - started
                print(f"{sum(answers.values())} cases, {elapsed:.0f} s", flush=True)
    elapsed = time.monotonic() - started
    total = sum(answers.values())
    print(f"\n{total} cases in {batches} batches, {elapsed:.0f} s ({total / elapsed:.0f}/s): ok")
    print("answers by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(answers.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
