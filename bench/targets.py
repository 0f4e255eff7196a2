"""What we benchmark, and the processes that serve it.

A ``Target`` says how to start one server in front of a fake upstream; ``Fleet`` starts the
fake upstreams, every target and the Redis server a target's store needs, all on free loopback
ports, checks each target answers a chat completion (plain and streamed), and kills them all on
exit, Ctrl-C included. A target that fails to start or to answer is recorded as unavailable with
the reason, and the run goes on without it. ``Fleet.warm`` compacts a session on a proxy target
and checks that a repeat of the request is served from the snapshot.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Literal

from loadgen import request_headers

BENCH = Path(__file__).resolve().parent
Kind = Literal["direct", "passthrough", "proxy"]
StoreKind = Literal["memory", "redis"]
# Far above the 100k-token request: the plain proxy targets measure the forwarding path.
FORWARDING_WINDOW = 1_000_000
# Trigger 0.8 x 120k = 96k, under the big request's ~111k tokens: it compacts to ~58k.
COMPACTING_WINDOW = 120_000


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    kind: Kind
    client: str = ""  # passthrough: its --client ("" for a script that has none)
    note: str = ""
    context_window: int = FORWARDING_WINDOW  # proxy: default_model.context_window
    store: StoreKind = "memory"  # proxy: store.url is memory:// or a Redis the Fleet starts
    workers: int = 1  # proxy: server.workers
    # Measured only by the scenarios that name it in ``Scenario.targets``.
    dedicated: bool = False
    script: str = "passthrough.py"  # passthrough: the bench/ script that serves it


TARGETS = (
    Target("direct", "direct", note="the fake upstream itself"),
    Target("passthrough-httpx", "passthrough", "httpx", "baseline: starlette + httpx"),
    Target("passthrough-httpx-aiohttp", "passthrough", "httpx-aiohttp"),
    Target(
        "passthrough-aiohttp",
        "passthrough",
        "aiohttp",
        "the earlier floor: a StreamingResponse and a background task for every reply",
    ),
    Target(
        "passthrough-lean",
        "passthrough",
        note="the floor: starlette + aiohttp, orjson body, one Response per non-streamed reply",
        script="passthrough_lean.py",
    ),
    Target("proxy", "proxy", note="compaction-proxy serve"),
    Target(
        "proxy-compacting",
        "proxy",
        note="the proxy with a 120k window: the 100k-token request compacts",
        context_window=COMPACTING_WINDOW,
        dedicated=True,
    ),
    Target(
        "proxy-compacting-redis",
        "proxy",
        note="proxy-compacting with its snapshots in a local redis-server",
        context_window=COMPACTING_WINDOW,
        store="redis",
        dedicated=True,
    ),
    Target(
        "proxy-2-workers",
        "proxy",
        note="the proxy with server.workers: 2 (one port, two processes)",
        workers=2,
        dedicated=True,
    ),
)
DEFAULT_TARGETS = (
    "direct",
    "passthrough-httpx",
    "passthrough-httpx-aiohttp",
    "passthrough-aiohttp",
    "passthrough-lean",
    "proxy",
    "proxy-compacting",
    "proxy-compacting-redis",
    "proxy-2-workers",
)
BASELINE = "passthrough-httpx"


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    delay_ms: float


@dataclass(frozen=True, slots=True)
class ProxyCounters:
    """A proxy's own counts from /metrics: chat requests by X-Compaction-Status, store errors."""

    statuses: dict[str, float]
    store_errors: float

    def since(self, before: ProxyCounters) -> ProxyCounters:
        statuses = {
            k: v - before.statuses.get(k, 0.0)
            for k, v in self.statuses.items()
            if v - before.statuses.get(k, 0.0)
        }
        return ProxyCounters(statuses, self.store_errors - before.store_errors)


_METRIC = re.compile(r'^compaction_proxy_(chat_requests|store_errors)_total\{\w+="(\w*)"\} (\S+)$')


def run_meta(**extra: object) -> dict[str, object]:
    """When and where a bench script ran, and with what (``extra``): its report's "meta"."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.system()} {platform.release()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        **extra,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# The proxy's idle upstream connections live as long as the floors' (aiohttp's default
# 15 s; the fake upstream keeps them 300 s). The product's 4 s (config.py: under uvicorn's
# 5 s) is shorter than the rotation leaves a target idle, so the proxy alone reconnected
# every round (bench/README.md, "Saturation, session of 2026-11-26: the upstream call,
# second pass").
UPSTREAM_KEEPALIVE_S = 15.0


def _proxy_config(path: Path, upstream_port: int, target: Target, store_url: str) -> Path:
    # The window decides what the 100k-token request measures: the forwarding path (a window
    # far above it) or compaction and snapshots (a window it overflows).
    lines = [
        "upstream:",
        f'  base_url: "http://127.0.0.1:{upstream_port}/v1"',
        '  api_key: "sk-bench"',
        f"  keepalive_timeout_s: {UPSTREAM_KEEPALIVE_S}",
        "store:",
        f'  url: "{store_url}"',
        "default_model:",
        f"  context_window: {target.context_window}",
        "  max_output_tokens: 4096",
    ]
    if target.workers > 1:
        lines += ["server:", f"  workers: {target.workers}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _command(
    target: Target, port: int, upstream_port: int, workdir: Path, store_url: str
) -> list[str]:
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if target.kind == "passthrough":
        upstream = f"http://127.0.0.1:{upstream_port}/v1"
        client = ["--client", target.client] if target.client else []
        script = str(BENCH / target.script)
        return [sys.executable, script, *address, "--upstream", upstream, *client]
    exe = Path(sys.executable).with_name("compaction-proxy")
    found = str(exe) if exe.exists() else shutil.which("compaction-proxy")
    if found is None:
        raise FileNotFoundError("compaction-proxy is not installed")
    config = _proxy_config(
        workdir / f"{target.name}-{upstream_port}.yaml", upstream_port, target, store_url
    )
    return [found, "serve", "--config", str(config), *address]


def _all_cpus() -> str:
    return ",".join(str(cpu) for cpu in range(os.cpu_count() or 1))


def pin_load_generation() -> int | None:
    """Move this process (and so every process it starts) off one CPU, and return that CPU
    for the targets: each one-worker target then has a core to itself, and neither wrk nor
    the upstream competes with it. None (nothing moved) without two CPUs or taskset."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return None
    os.sched_setaffinity(0, cpus[:-1])
    return cpus[-1]


def unpin_load_generation() -> None:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _log_tail(path: Path, lines: int = 6) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(text[-lines:]) or "(no output)"


@dataclass(slots=True)
class _Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


@dataclass(slots=True)
class Fleet:
    """Every process of one run, keyed by (target, upstream). Use as a context manager."""

    workdir: Path
    chat_body: bytes
    stream_body: bytes
    urls: dict[tuple[str, str], str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    # With pinning (run.py): the CPU every one-worker target runs on; the load generator,
    # the upstream and Redis stay on the others (this process's affinity, inherited).
    target_cpu: int | None = None
    _servers: list[_Server] = field(default_factory=list)
    _redis_url: str | None = None

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every process we started."""
        self._stop(list(self._servers))

    def _stop(self, servers: list[_Server]) -> None:
        # Each by its own handle: terminate, then kill whatever is still up after 5 s.
        for server in servers:
            if server.proc.poll() is None:
                server.proc.terminate()
        deadline = time.monotonic() + 5
        for server in servers:
            try:
                server.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=5)
            self._servers.remove(server)

    def _spawn(self, cmd: list[str], name: str, port: int) -> _Server:
        log = self.workdir / f"{name}-{port}.log"
        with log.open("wb") as out:
            # A session of its own: Ctrl-C reaches only us, and we stop it in order.
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        server = _Server(name, proc, port, log)
        self._servers.append(server)
        return server

    def start_upstream(self, upstream: Upstream) -> int:
        port = free_port()
        script = str(BENCH / "fake_upstream.py")
        cmd = [sys.executable, script, "--port", str(port), "--delay-ms", str(upstream.delay_ms)]
        server = self._spawn(cmd, f"upstream-{upstream.name}", port)
        self._ready(server, "fake upstream", timeout_s=30)
        self.urls["direct", upstream.name] = f"http://127.0.0.1:{port}/v1/chat/completions"
        return port

    def start_target(self, target: Target, upstream: Upstream, upstream_port: int) -> None:
        """Start ``target`` in front of ``upstream``; on failure, record it as unavailable."""
        if target.name in self.unavailable:
            return
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        server: _Server | None = None
        try:
            store_url = self.store_url(target.store) if target.kind == "proxy" else ""
            cmd = _command(target, port, upstream_port, self.workdir, store_url)
            if self.target_cpu is not None:
                cpus = str(self.target_cpu) if target.workers == 1 else _all_cpus()
                cmd = ["taskset", "-c", cpus, *cmd]
            server = self._spawn(cmd, target.name, port)
            self._ready(server, target.name, timeout_s=60)
            self._smoke(url)
        except (OSError, RuntimeError) as exc:
            self.unavailable[target.name] = str(exc)
            if server is not None:
                self._stop([server])
            return
        self.urls[target.name, upstream.name] = url

    def store_url(self, store: StoreKind) -> str:
        """The proxy's store.url; the first Redis target starts the one redis-server."""
        if store == "memory":
            return "memory://"
        if self._redis_url is None:
            exe = shutil.which("redis-server")
            if exe is None:
                raise FileNotFoundError("redis-server is not installed")
            port = free_port()
            # Nothing persisted: no RDB snapshots, no append-only file.
            cmd = [exe, "--port", str(port), "--bind", "127.0.0.1"]
            cmd += ["--save", "", "--appendonly", "no"]
            self._ready(self._spawn(cmd, "redis", port), "redis-server", timeout_s=30)
            self._redis_url = f"redis://127.0.0.1:{port}/0"
        return self._redis_url

    def _ready(self, server: _Server, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                code = server.proc.returncode
                raise RuntimeError(f"{name} exited with {code}: {_log_tail(server.log)}")
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{name} did not listen within {timeout_s:.0f}s")

    def _smoke(self, url: str) -> None:
        for body, expect in ((self.chat_body, b'"choices"'), (self.stream_body, b"[DONE]")):
            reply, _, lengths = _post(url, body, request_headers())
            if expect not in reply:
                raise RuntimeError(f"smoke reply lacks {expect!r}: {reply[:300]!r}")
            if len(lengths) > 1:
                # RFC 9112 6.3 lets a recipient reject this; wrk's parser does, so every request
                # would count as a socket error.
                raise RuntimeError(f"reply carries {len(lengths)} content-length headers")

    def warm(self, name: str, upstream: str, body: bytes, session: str) -> str:
        """Compact ``session`` on proxy target ``name``, then check a repeat is served from the
        snapshot; on failure drop the target. Returns the first request's X-Compaction-Status."""
        url = self.urls[name, upstream]
        statuses: list[str] = []
        try:
            for _ in range(2):
                statuses.append(_post(url, body, request_headers(session))[1])
            errors = self.counters(name, upstream).store_errors
        except (OSError, RuntimeError) as exc:
            self.drop(name, f"warm-up of session {session!r} failed: {exc}")
            return ""
        if statuses[-1] != "snapshot" or errors:
            reason = f"X-Compaction-Status {' then '.join(statuses)}, {errors:.0f} store errors"
            self.drop(name, f"session {session!r} not served from a snapshot: {reason}")
        return statuses[0]

    def counters(self, name: str, upstream: str) -> ProxyCounters:
        """The proxy target's request and store-error counters, from its /metrics."""
        url = self.urls[name, upstream].split("/v1/", 1)[0] + "/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        statuses: dict[str, float] = {}
        store_errors = 0.0
        for line in text.splitlines():
            m = _METRIC.match(line)
            if m and m[1] == "chat_requests":
                statuses[m[2]] = float(m[3])
            elif m:
                store_errors += float(m[3])
        return ProxyCounters(statuses, store_errors)

    def drop(self, name: str, reason: str) -> None:
        """Record ``name`` as unavailable and stop its processes (found unusable after start)."""
        self.unavailable[name] = reason
        self._stop([s for s in self._servers if s.name == name])
        self.urls = {key: url for key, url in self.urls.items() if key[0] != name}


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, str, list[str]]:
    """POST ``body``: the reply, its X-Compaction-Status ("" if none) and content-lengths."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            reply: bytes = resp.read()
            status = resp.headers.get("x-compaction-status", "")
            return reply, status, resp.headers.get_all("content-length") or []
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise RuntimeError(f"request got HTTP {exc.code}: {detail}") from exc
