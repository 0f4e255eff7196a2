"""CPU per request of the proxy's own code, in process: the 20-message chat far below its
threshold (no session header, a 1M window), sent to the app through ASGI.

    python bench/request_cpu.py [--stub] [--log] [--requests 2000] [--batches 5]
                                [--cprofile out.prof]
    python bench/request_cpu.py --stub --base DIR [--pairs 3]   # DIR's proxy/, then this tree's

The app is built as ``cpu_per_request.py``'s proxy is configured and sent the body as
``warm_profile.py`` sends it (``InProcess``: no client socket, no uvicorn). ``--stub``
replaces the upstream call by an answer built in process, after one turn of the event
loop (a real answer resumes the request once): what is left is the proxy's own work,
without aiohttp's, and figures move by ~1-2 µs between runs instead of ~5. Without it,
``fake_upstream.py`` answers over loopback. Prints the median of the batches' medians of
each request's CPU time on this thread, and the median of the batches' means of the
process's CPU a request, all threads (the log writer's: it formats request lines).
``--log``: logging configured as the server does, the lines to /dev/null (else
disabled). ``--base``: runs itself with ``PYTHONPATH=DIR`` and without, in turn,
``--pairs`` times (a ``git archive`` of another commit's ``proxy``).
Issue 27, bench/README.md "Saturation, session of 2026-11-26: the compacting route".
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import uvloop
from fake_upstream import _JSON_HEADERS, _REPLY
from payloads import build_payload
from targets import FORWARDING_WINDOW, free_port
from warm_profile import InProcess

import proxy
from proxy.app import create_app
from proxy.config import load_settings
from proxy.serve.server import GC_THRESHOLD
from proxy.upstream.client import UpstreamClient, UpstreamResponse

BENCH = Path(__file__).resolve().parent


def _stub_upstream() -> None:
    """Every upstream call answers ``fake_upstream.py``'s reply, after one loop turn."""
    from multidict import CIMultiDict, CIMultiDictProxy

    raw_list = (*_JSON_HEADERS, (b"date", b"Thu, 26 Nov 2026 01:00:00 GMT"), (b"server", b"x"))
    parsed = CIMultiDictProxy(CIMultiDict((k.decode(), v.decode()) for k, v in raw_list))

    class Answer(UpstreamResponse):
        started = None
        status_code = 200  # type: ignore[assignment]
        headers = parsed  # type: ignore[assignment]
        raw_headers = raw_list  # type: ignore[assignment]

        def __init__(self) -> None:
            pass

        async def aread(self) -> bytes:
            return _REPLY

        async def aread_closed(self) -> bytes:
            return _REPLY

        async def aclose(self) -> None:
            pass

    async def send(self: Any, method: str, url: Any, headers: Any, content: Any) -> Any:
        await asyncio.sleep(0)  # one resumption, as an upstream's answer makes
        return Answer()

    UpstreamClient.send = send  # type: ignore[method-assign]


async def _run(args: argparse.Namespace, port: int) -> None:
    config = Path(tempfile.mkdtemp(prefix="request-cpu-")) / "proxy.yaml"
    config.write_text(
        f'upstream: {{base_url: "http://127.0.0.1:{port}/v1", api_key: "sk-bench"}}\n'
        'store: {url: "memory://"}\n'
        f"default_model: {{context_window: {FORWARDING_WINDOW}, max_output_tokens: 4096}}\n"
    )
    client = InProcess(create_app(load_settings(config)), build_payload("chat20"), b"")
    await client.start()
    try:
        for _ in range(300):
            status = (await client.request()).get(b"x-compaction-status")
        assert status == b"passthrough", status
        gc.collect()
        gc.freeze()  # as the server's start-up does
        gc.set_threshold(GC_THRESHOLD)
        if args.cprofile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.requests):
                await client.request()
            profile.disable()
            profile.dump_stats(args.cprofile)
            print(f"wrote {args.cprofile} ({args.requests} requests)")
            return
        medians, process = [], []
        for _ in range(args.batches):
            times = []
            began = time.process_time_ns()
            for _ in range(args.requests):
                start = time.thread_time_ns()
                await client.request()
                times.append(time.thread_time_ns() - start)
            await asyncio.sleep(0.12)  # the log writer's last batch, its CPU counted
            process.append((time.process_time_ns() - began) / args.requests / 1e3)
            medians.append(statistics.median(times) / 1e3)
        runs = " ".join(f"{m:.1f}" for m in medians)
        print(
            f"{statistics.median(medians):.1f} µs CPU/request (batches: {runs}); "
            f"process, all threads, mean: {statistics.median(process):.1f}"
        )
    finally:
        await client.stop()


def _pairs(args: argparse.Namespace) -> None:
    own = [a for a in sys.argv[1:] if a not in ("--base", str(args.base))]
    command = [sys.executable, __file__, *own]
    for _ in range(args.pairs):
        for name, env in (("base", {"PYTHONPATH": str(args.base)}), ("this", {})):
            out = subprocess.run(
                command, env={**os.environ, **env}, capture_output=True, text=True, check=True
            )
            print(f"{name:5s} {out.stdout.strip().splitlines()[-1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stub", action="store_true", help="no upstream call: a built answer")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--cprofile", help="write a cProfile of --requests requests here")
    parser.add_argument("--log", action="store_true", help="log as the server does (/dev/null)")
    parser.add_argument("--base", type=Path, help="a tree whose proxy/ to compare with")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if args.base is not None:
        _pairs(args)
        return
    print(f"proxy from {Path(proxy.__file__).parent}", file=sys.stderr)
    if args.log:  # as the server configures it (the default settings), lines to /dev/null
        from proxy.config import LoggingSettings
        from proxy.observe.logs import configure_logging

        configure_logging(LoggingSettings(), open(os.devnull, "w"))  # noqa: SIM115
    else:
        logging.disable(logging.INFO)
    if args.stub:
        _stub_upstream()
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(BENCH / "fake_upstream.py"), "--port", str(port)]
    )
    try:
        for _ in range(100):  # up to 10 s for it to listen
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers (a 404 for GET /): listening
            except OSError:
                time.sleep(0.1)
        uvloop.run(_run(args, port))
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


if __name__ == "__main__":
    main()
