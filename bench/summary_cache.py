"""Does the summary call read the provider's prompt cache, and what does a long agent
session cost through the proxy? Issue 39 item 1. Simulator upstream, no network.

    python bench/summary_cache.py [--requests 200] [--window 32768] [--apis openai,anthropic]

One agent session of ``--requests`` model calls (a user turn asks for a tool call, the
tool's output comes back, the model acknowledges it: two calls a turn), played three
ways against the simulator with its prompt caches on (proxy/simulator/prompt_cache.py:
OpenAI's automatic caching on chat completions; anthropic_cache.py: Anthropic's
``cache_control`` breakpoints, reads and writes on Messages):

* ``direct``: the proxy with compaction off and no overflow recovery, so the upstream
  sees what the client sent, byte for byte, until the history overflows the window;
* ``transcript``: through the proxy, ``compaction.summary_prompt: transcript`` (the
  summary as it was asked before: a fresh system prompt and a quoted transcript);
* ``cached``: through the proxy, ``compaction.summary_prompt: cached`` (the turn's own
  request cut after the span, the instruction last).

The client is an agent as Claude Code and the Agents SDKs hold one: a long system prompt
and tools on every call, its whole history each time; on Messages a breakpoint on the
system prompt and on the newest message. After each call it waits for the proxy's
background compactions (think time), so runs compare call for call.

Everything is read from the simulator's billing records (``GET /_sim/requests``: each
call's usage), never from the proxy: the share of the summaries' input the cache served,
and the money of every call, summaries included, at list prices (USD per million tokens):
``anthropic`` Claude Sonnet 4's (input 3, cache read 0.30, cache write 3.75 for 5 minutes
and 6 for the hour, output 15), ``openai`` GPT-4.1's (input 2, cached input 0.50, output
8). ``until overflow``: the calls direct made before its first overflow, and each run's
money over those same calls.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retention import _free_port, _settled, _wait_up

ROOT = Path(__file__).resolve().parent.parent
# This checkout's proxy, whichever one the environment installed (python -m from its root).
PROXY = [sys.executable, "-m", "proxy"]

PRICES = {  # USD per million tokens: input, cached read, 5-minute write, hour write, output
    "anthropic": (3.00, 0.30, 3.75, 6.00, 15.00),
    "openai": (2.00, 0.50, 2.00, 2.00, 8.00),
}
MODEL = "bench-agent"
RULES = (
    "Follow the repository's conventions; read before you write; run the tests after every "
    "change; never guess a path; report what you changed and why. "
)
SYSTEM = "You are a careful coding agent working in a large repository. " + RULES * 60
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the repository",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
    for name in ("read_file", "search_code", "run_tests")
]
MESSAGES_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in CHAT_TOOLS
]
LINE = "def handler(request): return respond(request.user, request.path, status=200)  # ok\n"


@dataclass
class Run:
    api: str
    mode: str
    calls: int = 0
    failed_at: int | None = None  # the call that first failed (direct: its overflow)
    records: list[dict[str, Any]] = field(default_factory=list)

    def money(self, until: int | None = None) -> float:
        """USD of the session's calls (the summaries made meanwhile included), the first
        ``until`` client calls only when given."""
        total, seen = 0.0, 0
        for record in self.records:
            summary = record["headers"].get("x-compaction-purpose") == "summarize"
            if not summary:
                seen += 1
                if until is not None and seen > until:
                    break
            total += _price(self.api, record.get("usage") or {})
        return total

    def summaries(self) -> tuple[int, int, int]:
        """The summary calls, their input tokens and of those the cache's reads."""
        count = given = read = 0
        for record in self.records:
            if record["headers"].get("x-compaction-purpose") != "summarize":
                continue
            tokens, cached = _input(record.get("usage") or {})
            count, given, read = count + 1, given + tokens, read + cached
        return count, given, read


def _input(usage: dict[str, Any]) -> tuple[int, int]:
    """A call's input tokens and of them the ones its cache read, in either API's usage."""
    if "prompt_tokens" in usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return int(usage["prompt_tokens"]), int(cached)
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    return int(usage.get("input_tokens") or 0) + read + written, read


def _price(api: str, usage: dict[str, Any]) -> float:
    given, read_price, short_price, long_price, output = PRICES[api]
    if "prompt_tokens" in usage:
        tokens, cached = _input(usage)
        out = int(usage.get("completion_tokens") or 0)
        paid = (tokens - cached) * given + cached * read_price + out * output
        return paid / 1_000_000
    tiers = usage.get("cache_creation") or {}
    short = int(tiers.get("ephemeral_5m_input_tokens") or 0)
    long = int(tiers.get("ephemeral_1h_input_tokens") or 0)
    if not (short or long):
        short = int(usage.get("cache_creation_input_tokens") or 0)
    paid = int(usage.get("input_tokens") or 0) * given
    paid += int(usage.get("cache_read_input_tokens") or 0) * read_price
    paid += short * short_price + long * long_price
    paid += int(usage.get("output_tokens") or 0) * output
    return paid / 1_000_000


@contextmanager
def _servers(workdir: Path, window: int, proxy_yaml: str) -> Iterator[tuple[str, str]]:
    """The simulator and the proxy before it, as processes on loopback: their URLs."""
    workdir.mkdir(parents=True, exist_ok=True)
    sim_port, proxy_port = _free_port(), _free_port()
    (workdir / "sim.yaml").write_text(
        f'models:\n  - {{match: "bench-*", context_window: {window}, max_output_tokens: 16384}}\n'
    )
    (workdir / "proxy.yaml").write_text(
        f'upstream: {{base_url: "http://127.0.0.1:{sim_port}/v1", api_key: ""}}\n'
        f'models:\n  - {{match: "bench-*", context_window: {window}, max_output_tokens: 512}}\n'
        + proxy_yaml
    )
    with (workdir / "servers.log").open("wb") as log:
        sim = subprocess.Popen(
            [*PROXY, "simulate-upstream", "--config", str(workdir / "sim.yaml"),
             "--port", str(sim_port)],
            stdout=log, stderr=log, cwd=ROOT,
        )  # fmt: skip
        proxy = subprocess.Popen(
            [*PROXY, "serve", "--config", str(workdir / "proxy.yaml"), "--port", str(proxy_port)],
            stdout=log,
            stderr=log,
            cwd=ROOT,
        )
        try:
            _wait_up(f"http://127.0.0.1:{sim_port}/v1/models", sim, "simulator")
            _wait_up(f"http://127.0.0.1:{proxy_port}/healthz", proxy, "proxy")
            yield f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{proxy_port}"
        finally:
            for proc in (proxy, sim):
                proc.terminate()
            for proc in (proxy, sim):
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


class Agent:
    """One agent session on chat completions (``openai``) or Messages (``anthropic``)."""

    def __init__(self, url: str, api: str, run: Run) -> None:
        key = {"Authorization": "Bearer sk-bench-agent", "x-api-key": "sk-bench-agent"}
        headers = {**key, "X-Session-Id": f"agent-{api}", "anthropic-version": "2023-06-01"}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=300)
        self.url, self.api, self.run = url, api, run
        self.history: list[dict[str, Any]] = []

    def _send(self) -> dict[str, Any] | None:
        if self.api == "openai":
            system = [{"role": "system", "content": SYSTEM}]
            body: dict[str, Any] = {"model": MODEL, "messages": system + self.history}
            body.update(tools=CHAT_TOOLS, max_tokens=512)
            path = "/v1/chat/completions"
        else:
            system_blocks = [{"type": "text", "text": SYSTEM, "cache_control": _EPHEMERAL}]
            body = {"model": MODEL, "system": system_blocks, "tools": MESSAGES_TOOLS}
            body.update(messages=_with_breakpoint(self.history), max_tokens=512)
            path = "/v1/messages"
        self.run.calls += 1
        answer = self.http.post(path, json=body)
        _settled(self.url)
        if answer.status_code != 200:
            if self.run.failed_at is None:
                self.run.failed_at = self.run.calls
            return None
        data: dict[str, Any] = answer.json()
        if self.api == "openai":
            return dict(data["choices"][0]["message"])
        return {"role": "assistant", "content": data["content"]}

    def turn(self, n: int) -> bool:
        """One user turn: a request for a tool call, its output, the model's answer."""
        asked = f"Step {n}: look at module m{n} and tell me what it does. CALL 1"
        self.history.append({"role": "user", "content": asked})
        reply = self._send()
        if reply is None:
            return False
        self.history.append(reply)
        output = f"FACT k{n}=v{n}\n" + LINE * 14
        if self.api == "openai":
            for call in reply.get("tool_calls") or ():
                self.history.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        else:
            uses = [b for b in reply["content"] if b.get("type") == "tool_use"]
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": output} for b in uses
            ]
            self.history.append({"role": "user", "content": results})
        done = self._send()
        if done is None:
            return False
        self.history.append(done)
        return True


_EPHEMERAL = {"type": "ephemeral"}


def _with_breakpoint(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with a breakpoint on its newest message's last block, as Claude Code."""
    last = history[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": _EPHEMERAL}
    return [*history[:-1], {**last, "content": blocks}]


def play(api: str, mode: str, requests: int, window: int, workdir: Path) -> Run:
    if mode == "direct":
        proxy_yaml = 'compaction: {mode: "off", recover_overflow: false}\n'
    else:
        proxy_yaml = f"compaction: {{summary_prompt: {mode}}}\n"
    run = Run(api, mode)
    with _servers(workdir / f"{api}-{mode}", window, proxy_yaml) as (sim, url):
        agent = Agent(url, api, run)
        n = 0
        while run.calls < requests:
            n += 1
            if not agent.turn(n) and mode == "direct":
                break  # direct cannot go on past the window
        run.records = httpx.get(f"{sim}/_sim/requests", timeout=120).json()
    return run


def _table(runs: Sequence[Run]) -> str:
    direct = {r.api: r for r in runs if r.mode == "direct"}
    head = (
        "| pricing | run | calls | failed at | summaries | summary input | of it cached | "
        "USD until overflow | USD, all calls |\n|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for run in runs:
        until = direct[run.api].failed_at if run.api in direct else None
        before = None if until is None else until - 1
        count, given, read = run.summaries()
        share = f"{read / given:.1%}" if given else "-"
        rows.append(
            f"| {run.api} | {run.mode} | {run.calls} | {run.failed_at or '-'} | {count} | "
            f"{given:,} | {share} | {run.money(before):.4f} | {run.money():.4f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--window", type=int, default=32768)
    parser.add_argument("--apis", default="openai,anthropic")
    parser.add_argument("--modes", default="direct,transcript,cached")
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for api in args.apis.split(","):
            for mode in args.modes.split(","):
                started = time.monotonic()
                runs.append(play(api, mode, args.requests, args.window, Path(tmp)))
                print(f"{api} {mode}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
