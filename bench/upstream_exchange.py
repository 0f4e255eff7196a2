"""CPU per upstream exchange, in process: the lean floor's call against the proxy's.

    python bench/upstream_exchange.py [--base DIR] [--rounds 30] [--n 800] [--conc 16]

Starts ``fake_upstream.py`` on 127.0.0.1 in a process of its own, then times, in this one,
one non-streamed chat exchange (the 20-message body up, the fixed JSON answer back) done
three ways: ``floor``, as ``passthrough_lean.py`` does it (``session.request`` with a dict
of headers, ``read()``, one starlette ``Response``); ``new``, as this tree's pipeline does
(``UpstreamClient.send``, then ``relay``); with ``--base DIR`` also ``base``, the same with
the ``proxy`` package of DIR (e.g. a ``git archive`` of the commit to compare with, copied
under another name). ``--conc`` tasks share the calls; CPU µs per call from
``time.process_time`` (this process only: the upstream's CPU is not counted). The variants
take turns every round (ABBA), and the figures are medians of the rounds and of the paired
differences to the floor. bench/README.md, "Saturation, session of 2026-11-26: the
upstream call".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from passthrough import _HOP_BY_HOP, _TIMEOUT_S, POOL_SIZE
from payloads import build_payload
from starlette.responses import Response
from targets import BENCH, free_port

_DROP_REPLY = _HOP_BY_HOP | {"date", "server", "content-length"}
Call = Callable[[], Awaitable[None]]


def _importable_as(tree: Path, name: str) -> None:
    """``tree``'s ``proxy`` package, importable as ``name`` (its imports rewritten)."""
    where = Path(tempfile.mkdtemp(prefix="exchange-"))
    shutil.copytree(tree / "proxy", where / name)
    for path in (where / name).rglob("*.py"):
        text = re.sub(r"\b(from|import) proxy(\.|\b)", rf"\1 {name}\2", path.read_text())
        path.write_text(text)
    sys.path.insert(0, str(where))


async def _proxy_call(package: str, url: str, body: bytes) -> tuple[Call, Call]:
    config = importlib.import_module(f"{package}.config")
    policy = importlib.import_module(f"{package}.upstream.headers")
    client_module = importlib.import_module(f"{package}.upstream.client")
    relay = importlib.import_module(f"{package}.upstream.relay").relay
    upstream = {"base_url": url.rsplit("/chat", 1)[0], "api_key": "sk-bench"}
    settings = config.Settings.model_validate({"upstream": upstream})
    incoming = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    incoming += [(b"authorization", b"Bearer sk-bench"), (b"content-length", b"%d" % len(body))]
    headers = policy.HeaderPolicy(settings).outgoing(incoming)
    client = client_module.UpstreamClient(settings)
    extra = [(b"x-compaction-status", b"passthrough")]

    async def call() -> None:
        answer = await relay(await client.send("POST", url, headers, body), extra, None)
        assert answer.status_code == 200

    return call, client.aclose


async def _floor_call(url: str, body: bytes) -> tuple[Call, Call]:
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=POOL_SIZE, limit_per_host=0),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_read=_TIMEOUT_S),
    )

    async def call() -> None:
        upstream = await session.request("POST", url, headers=headers, data=body)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_REPLY}
        answer = Response(await upstream.read(), upstream.status, kept)
        assert answer.status_code == 200

    return call, session.close


async def _cpu_us(call: Call, n: int, conc: int) -> float:
    async def worker() -> None:
        for _ in range(n // conc):
            await call()

    gc.collect()
    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return (time.process_time() - start) / (n // conc * conc) * 1e6


async def _run(args: argparse.Namespace, url: str) -> None:
    body = build_payload("chat20")
    calls: dict[str, tuple[Call, Call]] = {"floor": await _floor_call(url, body)}
    if args.base is not None:
        calls["base"] = await _proxy_call("proxy_base", url, body)
    calls["new"] = await _proxy_call("proxy", url, body)
    try:
        for call, _ in calls.values():
            for _ in range(300):  # warm: connections, caches
                await call()
        names = list(calls)
        cpu: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                cpu[name].append(await _cpu_us(calls[name][0], args.n, args.conc))
    finally:
        for _, close in calls.values():
            await close()
    print(f"CPU us per exchange, c={args.conc}, {args.rounds} rounds of {args.n} calls")
    for name in names:
        v = cpu[name]
        diff = statistics.median(a - b for a, b in zip(v, cpu["floor"], strict=True))
        q = statistics.quantiles(v, n=4)
        print(
            f"{name:5} median {statistics.median(v):6.1f}  q1 {q[0]:6.1f}  q3 {q[2]:6.1f}"
            f"  paired over the floor {diff:+.1f}"
        )
    if "base" in cpu:
        diff = statistics.median(a - b for a, b in zip(cpu["new"], cpu["base"], strict=True))
        print(f"new - base, paired: {diff:+.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="a tree whose proxy/ to compare with")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--n", type=int, default=800, help="calls a round, per variant")
    parser.add_argument("--conc", type=int, default=16, help="tasks sharing them")
    args = parser.parse_args()
    if args.base is not None:
        _importable_as(args.base.resolve(), "proxy_base")
    port = free_port()
    fake = [sys.executable, str(BENCH / "fake_upstream.py"), "--port", str(port)]
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    upstream = subprocess.Popen(fake, **quiet)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        gc.set_threshold(10_000)  # as the proxy's server sets it (serve/server.py)
        uvloop.run(_run(args, f"http://127.0.0.1:{port}/v1/chat/completions"))
    finally:
        upstream.terminate()
        upstream.wait()


if __name__ == "__main__":
    main()
