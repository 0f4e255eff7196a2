"""Does any turn of a long agent run wait on a summary? Background pre-compaction, measured.

    python bench/precompact.py [--turns 200] [--chat-ms 250] [--summary-ms 2000] [--quick]
                               [--slots 1]

Starts the simulator (`compaction-proxy simulate-upstream`: chat answers take ``--chat-ms``,
summaries ``--summary-ms``) and two proxies in front of it, as processes on loopback:
``proxy`` (the defaults: pre-compaction from 60% of the window) and ``proxy-inline``
(``precompact_ratio: null``: the turn that crosses the trigger summarizes). Then it plays
the same agent run through each, and directly to the simulator (a model whose window is
big enough never to overflow): every step the user asks for two tool calls, their outputs
(~250 tokens each) go back, the model answers; two requests per step, ``--turns`` in all,
in a 16k window. A fact planted in a tool output every 10 steps is recalled at the end.

Prints, per target: per-turn latency p50/p99/max, the turns that waited on a summary (the
proxy's ``compaction_proxy_inline_summary_waits_total`` moved during the turn) and how many
of them came after the first compaction, compactions by trigger, facts recalled, and the
turns sent while a background summary ran (``--slots 1``: a single-slot server, where they
queue behind it: their latency shows it). Writes
``bench/results/precompact.json``. Exits 1 when ``proxy`` had a turn wait on a summary after
the first compaction, failed a turn, or lost a fact.
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

WINDOW = 16384
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
]
WORDS = "the build log shows the tests and the lint passing for the module under review " * 18
RESULTS = Path(__file__).parent / "results" / "precompact.json"
# The simulator's answer times: a quick chat model and a slow summary.
CHAT_MS = 250.0
SUMMARY_MS = 2000.0


@dataclass(slots=True)
class Row:
    target: str
    latencies_ms: list[float] = field(default_factory=list)
    waited: int = 0  # turns during which the proxy called the summarizer or waited on one
    waited_after_first: int = 0  # ...of those, after the first compaction was in use
    first_compacted_turn: int | None = None
    # Turns sent upstream while a background summary ran: a single-slot server (llama.cpp
    # -np 1) queues them behind it, which "waited" above does not see (the simulator
    # here has slots to spare, so they did not wait).
    sent_during_summary: int = 0
    background: int = 0
    inline: int = 0
    planted: int = 0
    recalled: int = 0
    failed: int = 0

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_ms)
        out = asdict(self)
        del out["latencies_ms"]
        out["turns"] = len(ordered)
        out["p50_ms"] = statistics.median(ordered) if ordered else 0.0
        out["p99_ms"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0
        out["max_ms"] = ordered[-1] if ordered else 0.0
        return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exe() -> str:
    found = Path(sys.executable).with_name("compaction-proxy")
    path = str(found) if found.exists() else shutil.which("compaction-proxy")
    if path is None:
        raise SystemExit("compaction-proxy is not installed (scripts/test sets up .venv)")
    return path


def _wait_up(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


@contextmanager
def _servers(
    workdir: Path, chat_ms: float, summary_ms: float, slots: int | None
) -> Iterator[dict[str, str]]:
    """The simulator (``slots``: as llama.cpp's -np) and both proxies; yields each target's
    base URL."""
    ports = {name: _free_port() for name in ("direct", "proxy", "proxy-inline")}
    sim_yaml = workdir / "sim.yaml"
    sim_yaml.write_text(
        f"latency_ms: {chat_ms}\nsummary_latency_ms: {summary_ms}\nslots: {slots or 'null'}\n"
        "models:\n"
        f'  - {{match: "agent-16k", context_window: {WINDOW}, max_output_tokens: 8192}}\n'
        '  - {match: "agent-direct", context_window: 1000000, max_output_tokens: 8192}\n'
    )
    commands = {"direct": [_exe(), "simulate-upstream", "--config", str(sim_yaml)]}
    for name, ratio in (("proxy", "0.6"), ("proxy-inline", "null")):
        path = workdir / f"{name}.yaml"
        path.write_text(
            f'upstream: {{base_url: "http://127.0.0.1:{ports["direct"]}/v1", '
            'api_key: "sk-bench"}\n'
            f'models: [{{match: "agent-*", context_window: {WINDOW}, max_output_tokens: 1024}}]\n'
            f"compaction: {{precompact_ratio: {ratio}}}\n"
        )
        commands[name] = [_exe(), "serve", "--config", str(path), "--host", "127.0.0.1"]
    procs: list[subprocess.Popen[bytes]] = []
    with (workdir / "servers.log").open("wb") as log:
        try:
            urls = {}
            for name, cmd in commands.items():
                proc = subprocess.Popen([*cmd, "--port", str(ports[name])], stdout=log, stderr=log)
                procs.append(proc)
                urls[name] = f"http://127.0.0.1:{ports[name]}"
                probe = "/v1/models" if name == "direct" else "/healthz"
                _wait_up(urls[name] + probe, proc, name)
            yield urls
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _metric(text: str, name: str, labels: str = "") -> int:
    pattern = re.compile(rf"^{re.escape(name)}({{[^}}]*}})? (\S+)$", re.MULTILINE)
    return int(sum(float(v) for found, v in pattern.findall(text) if labels in found))


class AgentRun:
    """One agent conversation against one target, timing each request."""

    def __init__(self, url: str, target: str, model: str) -> None:
        self.http = httpx.Client(
            base_url=url,
            headers={"Authorization": "Bearer sk-bench-agent", "X-Session-Id": "agent-run"},
            timeout=120,
        )
        self.url, self.model = url, model
        self.proxied = target != "direct"
        self.row = Row(target)
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. Keep every value."}
        ]
        self.facts: dict[str, str] = {}
        self._waits = 0

    def _send(self) -> dict[str, Any] | None:
        body = {"model": self.model, "messages": self.history, "tools": TOOLS}
        started = time.perf_counter()
        try:
            r = self.http.post("/v1/chat/completions", content=orjson.dumps(body))
        except httpx.HTTPError:
            r = None
        self.row.latencies_ms.append((time.perf_counter() - started) * 1000)
        if r is None or r.status_code != 200:
            self.row.failed += 1
            return None
        if self.proxied:
            self._account(int(r.headers["x-compaction-version"]))
        message: dict[str, Any] = r.json()["choices"][0]["message"]
        return message

    def _account(self, version: int) -> None:
        """Whether the turn just sent waited on a summary (outside its timing)."""
        text = httpx.get(f"{self.url}/metrics").text
        waits = _metric(text, "compaction_proxy_inline_summary_waits_total")
        turn = len(self.row.latencies_ms)
        if waits > self._waits:
            self.row.waited += 1
            if self.row.first_compacted_turn is not None:
                self.row.waited_after_first += 1
        self._waits = waits
        if version > 0 and self.row.first_compacted_turn is None:
            self.row.first_compacted_turn = turn

    def step(self, step: int) -> None:
        self.history.append({"role": "user", "content": f"Step {step}: check the module. CALL 2"})
        reply = self._send()
        if reply is None or not reply.get("tool_calls"):
            self.history.pop()
            return
        self.history.append(reply)
        for i, call in enumerate(reply["tool_calls"]):
            fact = ""
            if i == 0 and step % 10 == 0:
                key, value = f"k{step}", f"v{step * 37 % 1009}"
                self.facts[key] = value
                fact = f"FACT {key}={value} "
            output = f"{fact}step {step} file {i}: {WORDS}"
            self.history.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        done = self._send()
        self.history.append(done or {"role": "assistant", "content": "?"})

    def recall(self) -> None:
        asked = " ".join(f"RECALL {k}" for k in self.facts)
        self.history.append({"role": "user", "content": asked})
        body = {"model": self.model, "messages": self.history}
        r = self.http.post("/v1/chat/completions", content=orjson.dumps(body))
        answer = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
        found = dict(pair.split("=", 1) for pair in answer.split() if "=" in pair)
        self.row.planted = len(self.facts)
        self.row.recalled = sum(1 for k, v in self.facts.items() if found.get(k) == v)

    def finish(self) -> Row:
        if self.proxied:
            text = httpx.get(f"{self.url}/metrics").text
            name = "compaction_proxy_compactions_by_trigger_total"
            self.row.background = _metric(text, name, 'trigger="background"')
            self.row.inline = _metric(text, name, 'trigger="inline"')
            during = "compaction_proxy_turns_sent_during_summary_total"
            self.row.sent_during_summary = _metric(text, during)
        self.http.close()
        return self.row


def run(turns: int, chat_ms: float, summary_ms: float, slots: int | None = None) -> list[Row]:
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="precompact-") as tmp,
        _servers(Path(tmp), chat_ms, summary_ms, slots) as urls,
    ):
        for target, url in urls.items():
            model = "agent-direct" if target == "direct" else "agent-16k"
            agent = AgentRun(url, target, model)
            for step in range(turns // 2):
                agent.step(step)
            agent.recall()
            rows.append(agent.finish())
            s = rows[-1].summary()
            print(
                f"{target}: p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, "
                f"waited {s['waited']} ({s['waited_after_first']} after the first compaction), "
                f"{s['sent_during_summary']} sent during a background summary",
                flush=True,
            )
    return rows


def table(rows: Sequence[Row]) -> str:
    head = (
        "| target | turns | p50 ms | p99 ms | max ms | turns that waited on a summary "
        "| ...after the first compaction | compactions background/inline | facts recalled "
        "| failed | sent during a background summary |"
    )
    lines = [head, "|" + "---|" * 11]
    for row in rows:
        s = row.summary()
        lines.append(
            f"| {row.target} | {s['turns']} | {s['p50_ms']:.0f} | {s['p99_ms']:.0f} "
            f"| {s['max_ms']:.0f} | {row.waited} | {row.waited_after_first} "
            f"| {row.background}/{row.inline} | {row.recalled}/{row.planted} | {row.failed} "
            f"| {row.sent_during_summary} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="requests per target (even)")
    parser.add_argument("--chat-ms", type=float, default=CHAT_MS)
    parser.add_argument("--summary-ms", type=float, default=SUMMARY_MS)
    parser.add_argument("--quick", action="store_true", help="80 turns")
    parser.add_argument(
        "--slots", type=int, default=None, help="the simulator's slots (llama.cpp -np; 1: one)"
    )
    args = parser.parse_args(argv)
    turns = 80 if args.quick else args.turns
    started = time.monotonic()
    rows = run(turns, args.chat_ms, args.summary_ms, args.slots)
    print()
    print(table(rows))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(
        orjson.dumps(
            {
                "date": datetime.now(UTC).isoformat(timespec="minutes"),
                "machine": f"{platform.system()} {platform.release()} {platform.machine()}",
                "python": platform.python_version(),
                "seconds": round(time.monotonic() - started),
                "args": vars(args),
                "rows": [row.summary() for row in rows],
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    proxy = next(row for row in rows if row.target == "proxy")
    ok = not proxy.waited_after_first and not proxy.failed and proxy.recalled == proxy.planted
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
