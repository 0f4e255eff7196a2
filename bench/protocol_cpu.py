"""CPU per request of the server layer, in process: the proxy's HTTP protocol on a fake
transport, fed the 20-message chat request, a trivial app answering the proxy's reply.

    python bench/protocol_cpu.py [--requests 3000] [--batches 7]
    python bench/protocol_cpu.py --base DIR [--pairs 3]   # DIR's proxy/, then this tree's

No socket, no wrk, no app work: what is measured is ``serve/limits.py``'s protocol, its
``Cycle`` and uvicorn's code under them (httptools' parse, the request's task, two loop
turns), ±0.3 µs between runs where ``server_layer.py``'s wrk rounds move by several µs.
Prints the median of the batches' medians of each request's CPU time on this thread.
``--base``: runs itself with ``PYTHONPATH=DIR`` and without, in turn, ``--pairs`` times.
bench/README.md, "Saturation, session of 2026-11-26: the compacting route, third pass".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvloop
from payloads import build_payload
from server_layer import _app
from uvicorn.config import Config
from uvicorn.server import ServerState

from proxy.config import ServerSettings
from proxy.serve.limits import limited_protocol

_BODY = build_payload("chat20")
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
    b"Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data: Any) -> None:
        self.writes += 1

    def writelines(self, chunks: Any) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _run(args: argparse.Namespace) -> None:
    options: dict[str, Any] = {"access_log": False, "ws": "none", "lifespan": "off"}
    config = Config(_app, log_config=None, proxy_headers=False, **options)
    state = ServerState()
    server = limited_protocol(ServerSettings())(config=config, server_state=state, app_state={})
    transport = _Transport()
    server.connection_made(transport)
    medians = []
    for _ in range(args.batches):
        times = []
        for _ in range(args.requests):
            start = time.thread_time_ns()
            server.data_received(REQUEST)
            await asyncio.sleep(0)  # the request's task: read the body, answer
            await asyncio.sleep(0)
            times.append(time.thread_time_ns() - start)
        medians.append(statistics.median(times) / 1e3)
    if transport.writes != args.batches * args.requests:  # one write a response
        raise SystemExit(f"{transport.writes} writes for {args.batches * args.requests}")
    for task in state.tasks:
        task.cancel()
    runs = " ".join(f"{m:.2f}" for m in medians)
    print(f"{statistics.median(medians):.2f} µs CPU/request (batches: {runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--base", type=Path, help="a tree whose proxy/ to compare with")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if args.base is None:
        gc.freeze()  # as the server's start-up does
        uvloop.run(_run(args))
        return
    own = [a for a in sys.argv[1:] if a not in ("--base", str(args.base))]
    for _ in range(args.pairs):
        for name, env in (("base", {"PYTHONPATH": str(args.base)}), ("this", {})):
            out = subprocess.run(
                [sys.executable, __file__, *own],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                check=True,
            )
            print(f"{name:5s} {out.stdout.strip()}")


if __name__ == "__main__":
    main()
