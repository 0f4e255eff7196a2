"""CPU per request of the server layer alone: a trivial app under the proxy's HTTP protocol.

    python bench/server_layer.py [--rounds 10] [--seconds 2] [--variants proxy,uvicorn,...]

Serves, for each variant, an ASGI app that reads the body and answers the proxy's
non-streamed reply (249 bytes, the proxy's seven headers) under uvicorn (uvloop +
httptools, CPU 1), and loads each in turn with ``wrk -c64`` (CPU 0, the 20-message chat
body), the order alternating each round. Reads each server's user and system CPU time
from ``/proc``: with an app that does next to nothing, what the server layer costs per
request is most of what is measured, a few µs apart are seen where the whole proxy's
±30 µs per round on a shared machine hide them. Variants:

- ``proxy``: ``proxy.serve.limits``'s protocol as the proxy runs it;
- ``uvicorn-cycle``: the same with uvicorn's own ``RequestResponseCycle`` (a response's
  head and body in two writes);
- ``keepalive-timer``: the same with uvicorn's keep-alive timer armed per response;
- ``uvicorn``: uvicorn's own protocol, no limits.

bench/README.md, "Saturation, session of 2026-11-26: observability and the server layer".
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
from typing import Any

from loadgen import write_lua
from payloads import write_payloads
from targets import BENCH, free_port

_BODY = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":'
    b'"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}'
)
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-compaction-status", b"passthrough"),
    (b"x-compaction-version", b"0"),
    (b"x-context-tokens", b"2082"),
    (b"x-context-window", b"1000000"),
    (b"content-length", str(len(_BODY)).encode()),
    (b"x-request-id", b"a029398066a8efee000000000000012b"),
]
VARIANTS = ("proxy", "uvicorn-cycle", "keepalive-timer", "uvicorn")


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


def _protocol(variant: str) -> Any:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from proxy.config import ServerSettings
    from proxy.serve.limits import limited_protocol

    if variant == "uvicorn":
        return HttpToolsProtocol
    bounded: Any = limited_protocol(ServerSettings())
    if variant == "uvicorn-cycle":
        bounded.cycle_class = RequestResponseCycle
    if variant == "keepalive-timer":

        class _Timer(bounded):  # type: ignore[misc,valid-type]
            on_response_complete = HttpToolsProtocol.on_response_complete

            def data_received(self, data: bytes) -> None:
                self._unset_keepalive_if_required()
                super().data_received(data)

        return _Timer
    return bounded


def serve(port: int, variant: str) -> None:
    import uvicorn

    protocol = _protocol(variant)
    options: dict[str, Any] = {"access_log": False, "log_level": "warning", "ws": "none"}
    uvicorn.run(_app, host="127.0.0.1", port=port, http=protocol, loop="uvloop", **options)


def _cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    workdir = BENCH / "results" / "server_layer"
    workdir.mkdir(parents=True, exist_ok=True)
    script = write_lua(write_payloads(workdir)["chat20"])
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for variant in args.variants.split(","):
            port = free_port()
            cmd = [sys.executable, __file__, "--serve", str(port), variant]
            servers[variant] = (subprocess.Popen(["taskset", "-c", "1", *cmd], **quiet), port)
        time.sleep(3)
        _rounds(servers, script, args)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait()


def _rounds(
    servers: dict[str, tuple[subprocess.Popen[bytes], int]], script: Path, args: Any
) -> None:
    seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers}
    names = list(servers)
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in names if r % 2 == 0 else names[::-1]:
            proc, port = servers[name]
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            wrk = ["wrk", "-t1", "-c64", f"-d{args.seconds}s", "-s", str(script), url]
            user, system = _cpu(proc.pid)
            out = subprocess.run(["taskset", "-c", "0", *wrk], capture_output=True, text=True)
            user_after, system_after = _cpu(proc.pid)
            found = re.search(r"(\d+) requests in", out.stdout)
            if r and found:
                n = int(found.group(1))
                per = ((user_after - user) / n * 1e6, (system_after - system) / n * 1e6)
                seen[name].append((*per, n / args.seconds))
    print("variant | user µs/req | system µs/req | CPU µs/req | req/s (medians)")
    for name, rows in seen.items():
        user = statistics.median(row[0] for row in rows)
        system = statistics.median(row[1] for row in rows)
        total = statistics.median(row[0] + row[1] for row in rows)
        rate = statistics.median(row[2] for row in rows)
        print(f"{name} | {user:.1f} | {system:.1f} | {total:.1f} | {rate:,.0f}")


if __name__ == "__main__":
    main()
