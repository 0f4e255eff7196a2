"""The soak of issue 13: many conversations at once through one proxy process, long
enough for compaction to fire again and again, with every invariant checked.

Used by ``tests/e2e/test_soak.py`` (short, in CI) and ``bench/soak.py`` (long). ``Fleet``
starts, as processes on 127.0.0.1 (tests.support.starting), the simulator (``compaction-proxy
simulate-upstream``), a ``redis-server`` when the store is Redis, and the proxy with
its stderr in a file; it stops them all on exit. ``soak`` plays ``sessions``
conversations of ``turns`` turns at once (every other turn streamed), ``tenants``
API keys among them, each turn's user message ``FACT last=<session>t<turn> RECALL
last`` plus filler. The simulator answers ``last=<that value>`` only when that newest
message reached it (the last ``FACT`` in the request wins), so every answer proves
the newest message arrived. Checked (``Report.problems``):

- no failed request: every answer a 200 within ``REQUEST_TIMEOUT_S``;
- no lost message: every answer names its own turn's fact;
- no duplicate summarization: every summary the simulator wrote made one new
  snapshot version (their sum over the sessions), no session logged a version twice
  or lost a write race, and a session's ``X-Compaction-Version`` never went back;
- compaction fired, nothing overflowed, no summary failed, no store error, no ERROR
  or traceback in the proxy's log;
- the proxy's RSS, sampled every ``rss_every_s``, rises by at most
  ``Config.rss_growth_mb`` in the last third of the turns: with ``waves`` the same
  load comes again with new sessions, until the proxy's bounded state (the store's
  ``max_sessions``, the token counts cached per message) is full and memory levels off.

``idle_connections`` holds connections that send part of a request head, or nothing,
and measures normal requests meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import yaml

from tests.support.servers import RedisServer
from tests.support.starting import start_listening

MODEL = "soak-4k"
SUMMARIZER = "soak-summarizer"
WINDOW = 4096
REQUEST_TIMEOUT_S = 60.0
_WORDS = "keep careful notes about the module the build and the tests as we go along "
_COMPACTION = re.compile(r"compaction session=(\w+) .*outcome=(\w+) .*version=(\d+)")


@dataclass(frozen=True)
class Config:
    sessions: int = 200
    turns: int = 50
    waves: int = 1  # the soak again with new sessions: the same load, memory must level off
    tenants: int = 20
    store: str = "memory"  # or "redis": a redis-server of the fleet's own
    words: int = 80  # filler words per user message (~1 token each)
    seconds: float = 1800.0  # no turn starts after this
    rss_every_s: float = 1.0
    rss_growth_mb: float = 16.0  # the most RSS may rise in the last third of the turns
    max_sessions: int = 100_000  # the proxy's store.max_sessions


@dataclass
class Report:
    config: Config
    turns_done: int = 0
    failed: int = 0
    lost: int = 0
    version_regressions: int = 0
    streamed: int = 0
    examples: list[str] = field(default_factory=list)  # the first few failures, described
    statuses: Counter[str] = field(default_factory=Counter)  # X-Compaction-Status
    latencies_ms: list[float] = field(default_factory=list)
    rss: list[tuple[float, int, int]] = field(default_factory=list)  # (s, turns done, KB)
    seconds: float = 0.0
    summaries: int = 0  # the simulator's count
    versions: int = 0  # sum of the sessions' final snapshot versions
    sessions_compacted: int = 0
    upstream: dict[str, int] = field(default_factory=dict)  # the simulator's counters
    metrics: dict[str, float] = field(default_factory=dict)
    logged_versions_twice: int = 0
    lost_races: int = 0
    log_errors: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        self.failed += 1
        if len(self.examples) < 10:
            self.examples.append(what)

    @property
    def total_turns(self) -> int:
        return self.config.sessions * self.config.turns * self.config.waves

    @property
    def rss_growth_kb(self) -> int:
        """How much higher RSS went in the last third of the turns than before it."""
        mark = self.total_turns * 2 // 3
        before = [kb for _, done, kb in self.rss if done <= mark]
        after = [kb for _, done, kb in self.rss if done > mark]
        return max(after) - max(before) if before and after else 0

    def rss_table(self, points: int = 10) -> list[tuple[float, int, int]]:
        """About ``points`` samples, evenly spaced in turns done."""
        total = self.total_turns
        out: list[tuple[float, int, int]] = []
        for i in range(points + 1):
            mark = total * i // points
            sample = next((s for s in self.rss if s[1] >= mark), None)
            if sample is not None and sample not in out:
                out.append(sample)
        return out

    def problems(self) -> list[str]:
        c = self.config
        out = []
        if self.turns_done != self.total_turns:
            out.append(f"{self.turns_done} of {self.total_turns} turns done in time")
        if self.failed:
            out.append(f"{self.failed} failed requests, e.g. {self.examples[:3]}")
        if self.lost:
            out.append(f"{self.lost} answers did not name their turn's newest message")
        if self.version_regressions:
            out.append(f"{self.version_regressions} times a session's version went back")
        if self.summaries != self.versions:
            out.append(f"{self.summaries} summaries written, {self.versions} versions stored")
        if self.logged_versions_twice or self.lost_races:
            out.append(
                f"{self.logged_versions_twice} versions compacted twice, "
                f"{self.lost_races} lost write races"
            )
        if not self.sessions_compacted:
            out.append("no session compacted")
        for counter in ("overflows", "failures", "calls_abandoned", "streams_abandoned"):
            if self.upstream.get(counter):
                out.append(f"upstream {counter}: {self.upstream[counter]}")
        for name, value in self.metrics.items():
            if value:
                out.append(f"{name}: {value:g}")
        if self.log_errors:
            out.append(f"errors in the proxy's log: {self.log_errors[:3]}")
        if self.rss_growth_kb > c.rss_growth_mb * 1024:
            out.append(f"RSS rose {self.rss_growth_kb} KB in the last third of the turns")
        return out


_PROXY_CLI = (sys.executable, "-m", "proxy")


def _on(port: int) -> tuple[str, ...]:
    return ("--host", "127.0.0.1", "--port", str(port))


class Fleet:
    """Simulator, optional redis-server and the proxy, as processes; ``with`` stops them."""

    def __init__(
        self, store: str, workdir: Path | None = None, max_sessions: int = 100_000
    ) -> None:
        self.store = store
        self.max_sessions = max_sessions
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="soak-")
        self.workdir = workdir or Path(self._tmp.name if self._tmp else ".")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.sim = self.url = ""
        self.proxy: subprocess.Popen[bytes] | None = None
        self.redis: RedisServer | None = None
        self.log = self.workdir / f"proxy-{store}.log"

    def _serve(self, args: list[str], log: Path, ready_path: str, what: str) -> str:
        """``args`` and ``--host``/``--port`` on a free port, once ``ready_path`` answers
        (tests.support.starting); its URL."""
        process, port = start_listening(
            lambda port: [*args, *_on(port)], log, ready_path, what, ready=lambda s: s < 500
        )
        self.processes.append(process)
        if what == "the proxy":
            self.proxy = process
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> Fleet:
        try:
            self._launch()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _launch(self) -> None:
        w = self.workdir
        rule = {"match": MODEL, "context_window": WINDOW, "max_output_tokens": 256}
        # A summarizer with a window of its own that takes any span in one call: one
        # summary per new version, so the simulator's count checks for duplicates.
        summarizer = {"match": SUMMARIZER, "context_window": 8 * WINDOW}
        (w / "sim.yaml").write_text(
            yaml.safe_dump({"models": [rule, summarizer], "recording": {"max_requests": 0}})
        )
        self.sim = self._serve(
            [*_PROXY_CLI, "simulate-upstream", "--config", str(w / "sim.yaml")],
            w / "simulator.log",
            "/v1/models",
            "the simulator",
        )
        store: dict[str, Any] = {"url": "memory://", "max_sessions": self.max_sessions}
        if self.store == "redis":
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("redis-server is not installed")
            # Started, answering, and on a fresh port if its first was taken.
            self.redis = RedisServer(binary)
            self.redis.start()
            store["url"] = self.redis.url
        config = {
            "upstream": {"base_url": f"{self.sim}/v1"},
            "models": [rule],
            "compaction": {
                "summary_max_tokens": 400,
                "summarizer_model": SUMMARIZER,
                "summarizer_context_window": 8 * WINDOW,
            },
            "store": store,
        }
        (w / "proxy.yaml").write_text(yaml.safe_dump(config))
        self.url = self._serve(
            [*_PROXY_CLI, "serve", "--config", str(w / "proxy.yaml")],
            self.log,
            "/readyz",
            "the proxy",
        )

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.redis is not None:
            self.redis.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def rss_kb(self) -> int:
        assert self.proxy is not None
        status = Path(f"/proc/{self.proxy.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def _tenant(config: Config, session: int) -> str:
    return f"Bearer sk-soak-tenant-{session % config.tenants}"


def _stream_text(raw: bytes) -> str:
    text = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


async def _conversation(
    http: aiohttp.ClientSession,
    fleet: Fleet,
    config: Config,
    session: int,
    report: Report,
    deadline: float,
) -> None:
    headers = {"Authorization": _tenant(config, session), "X-Session-Id": f"soak-{session}"}
    history: list[dict[str, Any]] = [{"role": "system", "content": f"Session {session}."}]
    filler = (_WORDS * (config.words // len(_WORDS.split()) + 1)).split()[: config.words]
    version = 0
    for turn in range(config.turns):
        if time.monotonic() > deadline:
            return
        fact = f"s{session}t{turn}"
        text = f"FACT last={fact} RECALL last " + " ".join(filler)
        history.append({"role": "user", "content": text})
        streamed = (session + turn) % 2 == 0
        body = {"model": MODEL, "messages": history, "stream": streamed}
        started = time.perf_counter()
        where = f"session {session} turn {turn}"
        try:
            async with http.post(
                f"{fleet.url}/v1/chat/completions", data=orjson.dumps(body), headers=headers
            ) as r:
                raw = await r.read()
                status, answer_headers = r.status, r.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            report.fail(f"{where}: {type(exc).__name__}")
            history.pop()
            continue
        report.latencies_ms.append((time.perf_counter() - started) * 1000)
        report.turns_done += 1
        if status != 200:
            report.fail(f"{where}: HTTP {status} {raw[:200]!r}")
            history.pop()
            continue
        report.statuses[answer_headers.get("x-compaction-status", "?")] += 1
        now = int(answer_headers.get("x-compaction-version", "-1"))
        if now < version:
            report.version_regressions += 1
        version = max(version, now)
        if streamed:
            report.streamed += 1
            reply = _stream_text(raw)
        else:
            reply = orjson.loads(raw)["choices"][0]["message"]["content"]
        if reply != f"last={fact}":
            report.lost += 1
            report.fail(f"{where}: answered {reply[:80]!r}")
        history.append({"role": "assistant", "content": reply})


async def _sample_rss(fleet: Fleet, report: Report, every_s: float, started: float) -> None:
    while True:
        report.rss.append((time.monotonic() - started, report.turns_done, fleet.rss_kb()))
        await asyncio.sleep(every_s)


async def _play(fleet: Fleet, config: Config, report: Report) -> None:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=config.sessions)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        started = time.monotonic()
        deadline = started + config.seconds
        sampler = asyncio.create_task(_sample_rss(fleet, report, config.rss_every_s, started))
        try:
            for wave in range(config.waves):
                sessions = range(wave * config.sessions, (wave + 1) * config.sessions)
                before = await asyncio.to_thread(_summaries, fleet)
                await asyncio.gather(
                    *(_conversation(http, fleet, config, i, report, deadline) for i in sessions)
                )
                await asyncio.to_thread(_audit_wave, fleet, config, report, sessions, before)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        report.rss.append((time.monotonic() - started, report.turns_done, fleet.rss_kb()))
        report.seconds = time.monotonic() - started


def _summaries(fleet: Fleet) -> int:
    return int(httpx.get(f"{fleet.sim}/_sim/stats").json()["summaries"])


def _audit_wave(fleet: Fleet, config: Config, report: Report, sessions: range, before: int) -> None:
    """Once the wave's background compactions have ended: the summaries the simulator
    wrote during the wave, and the versions its sessions hold."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(f"{fleet.url}/metrics").text
        running = re.search(r"^compaction_proxy_precompactions_running (\S+)$", text, re.M)
        if running is None or float(running.group(1)) == 0:
            break
        time.sleep(0.1)
    report.summaries += _summaries(fleet) - before
    for session in sessions:
        r = httpx.get(
            f"{fleet.url}/sessions/soak-{session}",
            headers={"Authorization": _tenant(config, session)},
        )
        if r.status_code == 200 and r.json()["version"] > 0:
            report.versions += int(r.json()["version"])
            report.sessions_compacted += 1


def _metric_sums(text: str) -> dict[str, float]:
    """Counters that must stay at zero, summed over their labels."""
    wanted = {
        "compaction_proxy_store_errors_total": "store errors",
        "compaction_proxy_summary_failures_total": "summary failures",
        "compaction_proxy_summaries_truncated_total": "summaries truncated",
        "compaction_proxy_client_disconnects_total": "client disconnects",
        "compaction_proxy_snapshots_unreadable_total": "snapshots unreadable",
        "compaction_proxy_upstream_overflows_total": "upstream overflows",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted:
            out[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return out


def _audit(fleet: Fleet, report: Report) -> None:
    """What the upstream, /metrics and the log say at the end."""
    report.upstream = dict(httpx.get(f"{fleet.sim}/_sim/stats").json())
    report.metrics = _metric_sums(httpx.get(f"{fleet.url}/metrics").text)
    seen: Counter[tuple[str, str]] = Counter()
    for line in fleet.log.read_text(errors="replace").splitlines():
        found = _COMPACTION.search(line)
        if found and found.group(2) == "compacted":
            seen[(found.group(1), found.group(3))] += 1
        if "lost a write race" in line:
            report.lost_races += 1
        if " ERROR " in line or "Traceback" in line or line.startswith("ERROR"):
            report.log_errors.append(line[:200])
    report.logged_versions_twice = sum(1 for n in seen.values() if n > 1)


def soak(config: Config, workdir: Path | None = None) -> Report:
    """Start a fleet for ``config.store``, play the soak through it, audit it."""
    report = Report(config)
    with Fleet(config.store, workdir, max_sessions=config.max_sessions) as fleet:
        asyncio.run(_play(fleet, config, report))
        _audit(fleet, report)
    return report


@dataclass
class IdleReport:
    held: int
    open_while_measured: int  # of those, still open when the measurement ended
    requests: int
    failed: int
    baseline_ms: tuple[float, float]  # p50, p99 with no idle connections
    held_ms: tuple[float, float]  # p50, p99 while they are held

    def problems(self) -> list[str]:
        out = []
        if self.failed:
            out.append(f"{self.failed} of {self.requests} requests failed while idle ones held")
        if self.open_while_measured < self.held:
            out.append(f"only {self.open_while_measured} of {self.held} stayed open meanwhile")
        return out


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _timed_requests(url: str, count: int) -> tuple[list[float], int]:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "ping"}]})
    headers = {"Authorization": "Bearer sk-soak-probe", "Content-Type": "application/json"}
    latencies, failed = [], 0
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(count):
            started = time.perf_counter()
            try:
                ok = client.post(f"{url}/v1/chat/completions", content=body, headers=headers)
                failed += ok.status_code != 200
            except httpx.HTTPError:
                failed += 1
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies, failed


def idle_connections(url: str, count: int = 500, requests: int = 200) -> IdleReport:
    """Hold ``count`` connections, half sending part of a request head and then nothing,
    half sending nothing at all, while ``requests`` normal requests are timed; with
    the baseline of the same requests before. Measured within the proxy's
    ``server.header_timeout_s`` (10 s by default), after which it drops them."""
    baseline, failed_before = _timed_requests(url, requests)
    host, port = url.removeprefix("http://").split(":")
    held: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.create_connection((host, int(port)), timeout=5)
            if i % 2 == 0:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            held.append(sock)
        during, failed = _timed_requests(url, requests)
        still_open = 0
        for sock in held:
            sock.setblocking(False)
            try:
                still_open += sock.recv(1) != b""
            except BlockingIOError:
                still_open += 1  # nothing to read: open
            except OSError:
                pass
    finally:
        for sock in held:
            sock.close()
    return IdleReport(
        held=count,
        open_while_measured=still_open,
        requests=requests,
        failed=failed + failed_before,
        baseline_ms=_percentiles(baseline),
        held_ms=_percentiles(during),
    )
