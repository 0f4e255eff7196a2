"""Does a long conversation keep what matters, and does compaction pay? One command,
simulator upstream, no network.

    python bench/retention.py [--quick] [--configs chat-4k,agent-8k] [--cache-aware both]
        [--price 1,0.1,4] [--target-ratio 0.5]

For each configuration it starts the simulator (`compaction-proxy simulate-upstream`) and
the proxy (`compaction-proxy serve`) as processes on loopback, then plays one long
conversation through the proxy: a chat, or an agent loop of tool calls whose outputs carry
the facts. A fact (``FACT key=value``, the simulator recalls it only if it is still in the
request) is planted every few turns, until the proxy has compacted at least
``--compactions`` times (0: for ``--max-turns`` turns); then every fact is recalled. After
each turn it waits for the proxy's background compactions (a client's think time), so two
runs of a configuration compare turn for turn. The simulator's summarizer writes like
a real model (prose first, critical values last, cut off at ``max_tokens``) and, where the
configuration says so, forgets every third fact, so the proxy's length retries and its
identifier check are what keep the facts.

Prints one row per configuration and ``compaction.cache_aware`` setting (``both``, the
default: off, then on for as many turns): facts planted and recalled, summaries made,
summarizer calls per summary (on average, and the first compaction's: each call is seconds
to tens of seconds with a real model), summaries retried for length, identifiers restored
by the check, the share of prompt tokens saved, the ledger's net tokens saved (would-send
- sent - summarizer input and output, from /metrics), the cache hit rate (the simulator's
cached input tokens / input tokens sent, from each answer's usage: its prompt cache is
OpenAI's rule), the input the cache did not serve, prefix misses (turns whose cached prefix
fell under half the previous prompt: a moved cut), with ``--price`` the ledger's USD saved,
and failed turns (any answer but 200). Exits 1 unless every run recalled 100% with 0
failed turns.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

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
CALLS = "compaction_proxy_summarizer_calls_per_compaction"
WORDS = "the plan covers the code the tests and the notes for the next release of the service"


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    window: int
    reply_reserve: int  # the chat model's max_output_tokens: smaller than a full summary
    kind: str  # "chat" or "agent"
    forgets: int  # the summarizer leaves out every Nth fact (0: none)
    # Background pre-compaction; off, as README advises for a single-slot server (llama.cpp
    # -np 1), every summary is inline and folds a span as large as the trigger leaves.
    precompact: bool = True
    cache_aware: bool = False  # compaction.cache_aware (proxy/core/cache_cuts.py)
    price: str = ""  # "input,cached_input,output" USD per million tokens: the ledger's money
    target_ratio: float = 0.5  # compaction.target_ratio


CONFIGS = (
    Config("chat-4k", 4096, 256, "chat", 3),
    Config("chat-4k-inline", 4096, 256, "chat", 3, precompact=False),
    Config("chat-16k", 16384, 512, "chat", 3),
    Config("agent-8k", 8192, 256, "agent", 3),
    Config("chat-32k", 32768, 1024, "chat", 0),
    Config("chat-128k", 131072, 1024, "chat", 3),
)


@dataclass(slots=True)
class Row:
    config: str
    cache_aware: bool = False
    turns: int = 0
    planted: int = 0
    recalled: int = 0
    compactions: int = 0
    summaries: int = 0
    calls: int = 0  # summarizer calls, every chunk and retry of every summary
    first_calls: int = 0  # the first compaction's
    length_retries: int = 0
    restored: int = 0
    sent_tokens: int = 0
    full_tokens: int = 0
    failed: int = 0
    seconds: float = 0.0
    prompt: int = 0  # the upstream's input tokens (usage), every turn
    cached: int = 0  # of them, served from its prompt cache
    misses: int = 0  # turns after the first whose cached prefix fell under half the last prompt
    net: int = 0  # the ledger's net tokens saved (/metrics)
    money: float | None = None  # the ledger's USD saved, when priced (--price)
    last_prompt: int = 0
    played: int = 0  # conversation turns before the recall

    @property
    def hit_rate(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    @property
    def saved(self) -> float:
        return 1 - self.sent_tokens / self.full_tokens if self.full_tokens else 0.0


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
    deadline = time.monotonic() + 30
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
def _servers(config: Config, workdir: Path) -> Iterator[str]:
    sim = (
        "models:\n"
        f'  - {{match: "bench-*", context_window: {config.window}, '
        f"max_output_tokens: {config.window // 2}, summary_style: realistic, "
        f"summary_forgets: {config.forgets}}}\n"
    )
    proxy = (
        "models:\n"
        f'  - {{match: "bench-*", context_window: {config.window}, '
        f"max_output_tokens: {config.reply_reserve}, "
        f"precompact: {str(config.precompact).lower()}}}\n"
        f"compaction: {{cache_aware: {str(config.cache_aware).lower()}, "
        f"target_ratio: {config.target_ratio}}}\n"
    )
    if config.price:
        given, cached, output = config.price.split(",")
        proxy += f"pricing: [{{input: {given}, cached_input: {cached}, output: {output}}}]\n"
    name = f"{config.name}-cache-aware" if config.cache_aware else config.name
    with serve(workdir / name, sim, proxy) as (url, _):
        yield url


@contextmanager
def serve(workdir: Path, sim_yaml: str, proxy_yaml: str) -> Iterator[tuple[str, int]]:
    """The simulator and the proxy in front of it, as processes on loopback, configured
    with these YAML texts (the proxy's upstream is added); the proxy's URL and PID.
    Their configs and logs go to ``workdir``; both are stopped on the way out."""
    workdir.mkdir(parents=True, exist_ok=True)
    sim_port, proxy_port = _free_port(), _free_port()
    (workdir / "sim.yaml").write_text(sim_yaml)
    (workdir / "proxy.yaml").write_text(
        f'upstream: {{base_url: "http://127.0.0.1:{sim_port}/v1", api_key: "sk-bench"}}\n'
        + proxy_yaml
    )
    with (workdir / "servers.log").open("wb") as log:
        sim = subprocess.Popen(
            [_exe(), "simulate-upstream", "--config", str(workdir / "sim.yaml"),
             "--port", str(sim_port)],
            stdout=log,
            stderr=log,
        )  # fmt: skip
        proxy = subprocess.Popen(
            [_exe(), "serve", "--config", str(workdir / "proxy.yaml"), "--port", str(proxy_port)],
            stdout=log,
            stderr=log,
        )
        try:
            _wait_up(f"http://127.0.0.1:{sim_port}/v1/models", sim, "simulator")
            _wait_up(f"http://127.0.0.1:{proxy_port}/healthz", proxy, "proxy")
            yield f"http://127.0.0.1:{proxy_port}", proxy.pid
        finally:
            for proc in (proxy, sim):
                proc.terminate()
            for proc in (proxy, sim):
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _metric(text: str, name: str, labels: str = "") -> int:
    """The sum of a counter's samples in a Prometheus exposition (0 when absent), over
    the samples whose labels contain ``labels``."""
    return int(_sample_sum(text, name, labels))


def _sample_sum(text: str, name: str, labels: str = "") -> float:
    pattern = re.compile(rf"^{re.escape(name)}({{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for found, v in pattern.findall(text) if labels in found)


def _settled(url: str) -> None:
    """Until no background compaction runs (at most 60 s): a client's think time, so that
    runs of one configuration compare turn for turn, whatever the machine's load."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = _metric(
            httpx.get(f"{url}/metrics").text, "compaction_proxy_precompactions_running"
        )
        if not running:
            return
        time.sleep(0.05)


def _first_calls(text: str) -> int:
    """The calls of the first summary, once there is one (0 before)."""
    return _metric(text, f"{CALLS}_sum") if _metric(text, f"{CALLS}_count") == 1 else 0


class Conversation:
    def __init__(self, url: str, config: Config, counter: Any) -> None:
        self.http = httpx.Client(
            base_url=url,
            headers={"Authorization": "Bearer sk-bench-tenant", "X-Session-Id": config.name},
            timeout=120,
        )
        self.config = config
        self.counter = counter
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful assistant. Keep every value."}
        ]
        self.facts: dict[str, str] = {}
        self.row = Row(config.name, config.cache_aware)

    def _send(self, **extra: Any) -> dict[str, Any] | None:
        body = {"model": f"bench-{self.config.name}", "messages": self.history, **extra}
        self.row.turns += 1
        try:
            r = self.http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError:
            self.row.failed += 1
            return None
        if r.status_code != 200:
            self.row.failed += 1
            return None
        self.row.sent_tokens += int(r.headers["x-context-tokens"])
        self.row.full_tokens += sum(self.counter.message(m) for m in self.history)
        self._usage(r.json().get("usage") or {})
        message: dict[str, Any] = r.json()["choices"][0]["message"]
        return message

    def _usage(self, usage: dict[str, Any]) -> None:
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        row = self.row
        if row.last_prompt >= 1024 and cached < row.last_prompt // 2:
            row.misses += 1
        row.prompt, row.cached, row.last_prompt = row.prompt + prompt, row.cached + cached, prompt

    def _fact(self, turn: int) -> str:
        key = f"k{turn}"
        value = hashlib.blake2b(f"{self.config.name}-{turn}".encode(), digest_size=4).hexdigest()
        self.facts[key] = value
        self.row.planted += 1
        return f"FACT {key}={value}"

    def _filler(self, turn: int) -> str:
        words = max(self.config.window // 60, 20)
        text = " ".join((WORDS.split() * (words // 16 + 1))[:words])
        return f"Turn {turn}: {text}"

    def turn(self, turn: int) -> None:
        fact = self._fact(turn) if turn % 4 == 0 else ""
        if self.config.kind == "agent":
            self.history.append({"role": "user", "content": f"{self._filler(turn)} CALL 2"})
            reply = self._send(tools=TOOLS)
            if reply is None:
                self.history.pop()
                return
            self.history.append(reply)
            for i, call in enumerate(reply.get("tool_calls") or ()):
                output = f"{fact if i == 0 else ''} {self._filler(turn)}".strip()
                self.history.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            done = self._send(tools=TOOLS)
            if done is not None:
                self.history.append(done)
            return
        self.history.append({"role": "user", "content": f"{self._filler(turn)} {fact}".strip()})
        reply = self._send()
        if reply is None:
            self.history.pop()
            return
        self.history.append(reply)

    def recall(self) -> None:
        keys = list(self.facts)
        for start in range(0, len(keys), 8):
            batch = keys[start : start + 8]
            self.history.append({"role": "user", "content": " ".join(f"RECALL {k}" for k in batch)})
            reply = self._send()
            answer = str(reply.get("content") or "") if reply else ""
            self.history.append({"role": "assistant", "content": answer or "?"})
            found = dict(pair.split("=", 1) for pair in answer.split() if "=" in pair)
            self.row.recalled += sum(1 for k in batch if found.get(k) == self.facts[k])


def run_config(config: Config, min_compactions: int, max_turns: int, workdir: Path) -> Row:
    """One conversation: until ``min_compactions`` (0: for ``max_turns`` turns), then the
    recall."""
    from proxy.core.encodings import load_encoders
    from proxy.core.tokens import TokenCounter

    counter = TokenCounter(load_encoders(["cl100k_base"])["cl100k_base"])
    started = time.monotonic()
    with _servers(config, workdir) as url:
        chat = Conversation(url, config, counter)
        for turn in range(max_turns):
            chat.turn(turn)
            chat.row.played = turn + 1
            _settled(url)
            if not chat.row.first_calls:
                chat.row.first_calls = _first_calls(httpx.get(f"{url}/metrics").text)
            if min_compactions and turn % 5 == 4:
                metrics = httpx.get(f"{url}/metrics").text
                done = _metric(metrics, "compaction_proxy_compactions_total")
                if done >= min_compactions:
                    break
        chat.recall()
        metrics = httpx.get(f"{url}/metrics").text
    row = chat.row
    row.compactions = _metric(metrics, "compaction_proxy_compactions_total")
    row.summaries = _metric(metrics, "compaction_proxy_compactions_total", 'outcome="compacted"')
    row.calls = _metric(metrics, f"{CALLS}_sum")
    row.length_retries = _metric(metrics, "compaction_proxy_summary_length_retries_total")
    row.restored = _metric(metrics, "compaction_proxy_identifiers_restored_total")
    saved = "compaction_proxy_tokens_saved_total"
    kinds = ("sent", "summarizer_input", "summarizer_output")
    row.net = _metric(metrics, saved, 'kind="would_send"')
    row.net -= sum(_metric(metrics, saved, f'kind="{kind}"') for kind in kinds)
    if config.price:
        cost = "compaction_proxy_cost_usd_total"
        row.money = _sample_sum(metrics, cost, 'side="would_have_paid"')
        row.money -= _sample_sum(metrics, cost, 'side="paid"')
    row.seconds = time.monotonic() - started
    return row


def _table(rows: Sequence[Row]) -> str:
    head = (
        "| config | cache-aware | turns | facts recalled | compactions | summaries "
        "| calls per summary (first) | length retries "
        "| identifiers restored | tokens saved | net tokens saved | cache hit rate "
        "| uncached input | prefix misses | USD saved | failed turns | seconds |"
    )
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        pct = f"{r.recalled}/{r.planted} ({100 * r.recalled / max(r.planted, 1):.0f}%)"
        lines.append(
            f"| {r.config} | {'on' if r.cache_aware else 'off'} | {r.turns} | {pct} "
            f"| {r.compactions} | {r.summaries} "
            f"| {r.calls / max(r.summaries, 1):.2f} ({r.first_calls}) "
            f"| {r.length_retries} | {r.restored} | {100 * r.saved:.0f}% | {r.net:,} "
            f"| {100 * r.hit_rate:.1f}% | {r.prompt - r.cached:,} | {r.misses} "
            f"| {'-' if r.money is None else f'{r.money:.4f}'} | {r.failed} "
            f"| {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def _progress(row: Row) -> Row:
    aware = " (cache-aware)" if row.cache_aware else ""
    print(
        f"{row.config}{aware}: recalled {row.recalled}/{row.planted}, "
        f"{row.compactions} compactions, {row.calls} summarizer calls "
        f"(the first compaction: {row.first_calls}), {row.failed} failed, "
        f"{row.seconds:.0f} s; net tokens saved {row.net}, cache hits "
        f"{100 * row.hit_rate:.1f}% ({row.cached}/{row.prompt})",
        flush=True,
    )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", help="comma-separated names (default: all)")
    parser.add_argument("--compactions", type=int, default=10)
    parser.add_argument("--max-turns", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="3 compactions, 4k/8k only")
    parser.add_argument(
        "--cache-aware",
        choices=("both", "off", "on"),
        default="both",
        help="compaction.cache_aware: both (default) plays each configuration off, then on "
        "for as many turns",
    )
    parser.add_argument("--target-ratio", type=float, default=0.5, help="compaction.target_ratio")
    parser.add_argument(
        "--price",
        default="",
        help="INPUT,CACHED_INPUT,OUTPUT USD per million tokens for the ledger's money saved "
        "(an illustration, not any provider's price); default: tokens only",
    )
    args = parser.parse_args(argv)
    configs = [replace(c, price=args.price, target_ratio=args.target_ratio) for c in CONFIGS]
    if args.quick:
        args.compactions = 3
        configs = [c for c in configs if c.window <= 8192]
    if args.configs:
        wanted = set(args.configs.split(","))
        configs = [c for c in configs if c.name in wanted]
    rows = []
    with tempfile.TemporaryDirectory(prefix="retention-") as tmp:
        for config in configs:
            first = replace(config, cache_aware=args.cache_aware == "on")
            row = _progress(run_config(first, args.compactions, args.max_turns, Path(tmp)))
            rows.append(row)
            if args.cache_aware == "both":  # the same turns again: compared turn for turn
                aware = replace(config, cache_aware=True)
                rows.append(_progress(run_config(aware, 0, row.played, Path(tmp))))
    print()
    print(_table(rows))
    ok = all(r.recalled == r.planted and r.failed == 0 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
