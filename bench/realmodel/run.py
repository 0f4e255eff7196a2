"""Real-model bench: planted facts and tool values, recalled past the window, three ways.

    python bench/realmodel/run.py --model 0.5b --scenario facts --windows 4096 --replicates 1

Starts llama.cpp's ``llama-server`` (built by ``setup.sh``) on loopback with one thread, and
for each window, seed and mode plays one scripted conversation with the official ``openai``
SDK:

- ``control``: straight to llama-server, the facts and the questions with no filler (the
  model can read its answers from its context: the ceiling);
- ``direct``: straight to llama-server until it refuses the conversation (the turn it
  fails at is recorded; its latencies are the baseline);
- ``trim``: a client that drops its oldest turns (whole user-led groups) once the view
  passes 90% of the window, down to 60%: the leanest correct alternative to the proxy;
- ``proxy``: through ``python -m proxy serve`` with a generated config (the window in
  ``models``, the compaction settings given by ``--proxy-set`` and
  ``--proxy-config-extra``);
- ``proxy-LABEL``: the same with ``--proxy-variant LABEL:KEY=VALUE,...`` on top (e.g.
  ``--proxy-variant no-recall:compaction.recall_budget_ratio=0``), played after ``proxy`` against
  the same seeds, so two configurations compare in one invocation.

Scenarios: ``facts`` (8 planted facts, one per kind, each in one of several phrasings
picked by seed, ``phrasings.py``; filler chat to ``--fill`` times the window; one question
per fact, also in wordings picked by seed) and ``agent`` (scripted tool calls whose
outputs carry ``KEY = VALUE`` values, bulky build/test outputs to ``--fill`` times the
window, one question per value; the bench writes the assistant's tool calls into the
history as a client replays them and asks the model only for its reply after the tool
results and for the answers).

Every process it starts is stopped by PID when it ends; every run is bounded by
``--run-seconds`` (the filler is cut short past it; the questions are always asked) and
every request by ``--request-timeout``. Writes one JSON per invocation to
``bench/realmodel/results/`` and prints two markdown tables: medians over replicates per
mode, and recall per kind of fact per mode (with the held-out phrasings' share).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import phrasings
import scenarios
import tap

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"
MODEL_NAME = "bench-model"
MODES = ("control", "direct", "trim", "proxy")
TRIM_HIGH, TRIM_LOW = 0.9, 0.6
QUESTION_TOKENS = 32
SETTLE_S = 0.2  # after a turn, before reading /metrics (background summaries start after it)


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cached_paths() -> dict[str, Path]:
    """``setup.sh paths``: where the server binary and the models are cached."""
    out = subprocess.run(
        ["bash", str(HERE / "setup.sh"), "paths"], check=True, capture_output=True, text=True
    ).stdout
    return {k: Path(v) for k, v in (line.split(" ", 1) for line in out.splitlines() if line)}


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{what} did not become ready in {seconds:.0f} s")


@contextmanager
def process(cmd: list[str], log: Path, ready_url: str, what: str) -> Iterator[int]:
    """Start ``cmd`` (output to ``log``), wait for ``ready_url``, stop it by PID on exit."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_up(ready_url, proc, what, 180)
        yield proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@contextmanager
def llama_server(args: argparse.Namespace, window: int, workdir: Path) -> Iterator[str]:
    port = free_port()
    cmd = [
        str(args.server_bin),
        "-m",
        str(args.model_path),
        "-c",
        str(window * args.parallel),  # each slot gets the whole window
        "-t",
        str(args.threads),
        "-np",
        str(args.parallel),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--jinja",
        "--metrics",
        *(["--cache-reuse", str(args.cache_reuse)] if args.cache_reuse else []),
    ]
    log = workdir / f"llama-server-{window}.log"
    base = f"http://127.0.0.1:{port}"
    with process(cmd, log, base + "/health", "llama-server"):
        yield base


def _yaml_value(text: str) -> Any:
    """``--proxy-set`` values: JSON where it parses (numbers, null, true), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, mappings merged key by key (lists and scalars replaced)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def config_extra(text: str) -> dict[str, Any]:
    """``--proxy-config-extra``: a YAML mapping, inline or ``@path`` to a file."""
    loaded = yaml.safe_load(Path(text[1:]).read_text() if text.startswith("@") else text)
    if not isinstance(loaded, dict):
        raise SystemExit(f"--proxy-config-extra must be a YAML mapping, not {text!r}")
    return loaded


def variants(specs: Sequence[str]) -> dict[str, list[str]]:
    """``--proxy-variant LABEL:KEY=VALUE,KEY=VALUE``: mode ``proxy-LABEL``, its settings."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        label, _, settings = spec.partition(":")
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", label) or "=" not in settings:
            raise SystemExit(f"--proxy-variant wants LABEL:KEY=VALUE[,KEY=VALUE], not {spec!r}")
        out[f"proxy-{label}"] = [item for item in settings.split(",") if item]
    return out


def proxy_config(
    args: argparse.Namespace, window: int, upstream: str, mode: str = "proxy"
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "upstream": {"base_url": f"{upstream}/v1", "api_key": "", "timeout_s": 600},
        "store": {"url": "memory://"},
        "models": [
            {
                "match": MODEL_NAME,
                "context_window": window,
                "max_output_tokens": max(args.reply_tokens, QUESTION_TOKENS),
            }
        ],
        "compaction": {},
    }
    for extra in args.proxy_config_extra:
        config = merge(config, config_extra(extra))
    for item in [*args.proxy_set, *variants(args.proxy_variant).get(mode, [])]:
        key, _, value = item.partition("=")
        section, _, name = key.rpartition(".")
        if section == "model":  # the bench model's own entry: model.precompact=false
            config["models"][0][name] = _yaml_value(value)
            continue
        node = config
        for part in (section or "compaction").split("."):  # compaction.recall.x=1 nests
            node = node.setdefault(part, {})
        node[name] = _yaml_value(value)
    return config


def proxy_log(path: Path) -> dict[str, Any]:
    """The proxy's compaction lines: outcomes by trigger, and its warnings (distinct)."""
    outcomes: Counter[str] = Counter()
    warnings: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("msg") == "compaction":
            outcomes[f"{entry.get('trigger')}:{entry.get('outcome')}"] += 1
        elif entry.get("level") in ("warning", "error"):
            # session hashes differ run to run: keep the text after them
            warnings[re.sub(r"session=\w+ ", "", str(entry.get("msg")))[:240]] += 1
    return {"outcomes": dict(outcomes), "warnings": dict(warnings.most_common(12))}


@contextmanager
def proxy(
    args: argparse.Namespace, window: int, upstream: str, workdir: Path, mode: str
) -> Iterator[str]:
    port = free_port()
    path = workdir / f"proxy-{window}-{port}.yaml"
    with ExitStack() as stack:
        if args.capture:  # the prompts the model saw, for tracing a miss (tap.py)
            prefix = workdir / f"upstream-{window}-{port}"
            relayed = stack.enter_context(tap.relay(int(upstream.rsplit(":", 1)[1]), prefix))
            upstream = f"http://127.0.0.1:{relayed}"
        # JSON is YAML: no YAML writer needed.
        path.write_text(json.dumps(proxy_config(args, window, upstream, mode), indent=2))
        cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(path)]
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
        base = f"http://127.0.0.1:{port}"
        with process(cmd, workdir / f"proxy-{window}-{port}.log", base + "/healthz", "proxy"):
            yield base


def proxy_log_path(workdir: Path, target: str, window: int) -> Path:
    return workdir / f"proxy-{window}-{target.rsplit(':', 1)[1]}.log"


# -- token counting (the trimming client) -------------------------------------------------


class LlamaTokens:
    """Exact prompt tokens of a view: llama-server's own template and tokenizer."""

    def __init__(self, base: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=60)

    def prompt_tokens(self, messages: list[dict[str, Any]], tools: Any = None) -> int:
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        prompt = self.http.post("/apply-template", json=body).raise_for_status().json()["prompt"]
        tokens = self.http.post("/tokenize", json={"content": prompt}).raise_for_status().json()
        return len(tokens["tokens"])

    def text_tokens(self, text: str) -> int:
        r = self.http.post("/tokenize", json={"content": text}).raise_for_status()
        return len(r.json()["tokens"])

    def close(self) -> None:
        self.http.close()


def trim_view(
    history: list[dict[str, Any]],
    start: int,
    budget: int,
    count: Callable[[list[dict[str, Any]]], int],
    window: int,
) -> tuple[list[dict[str, Any]], int]:
    """The trimming client: pinned system + history[start:], cut by whole user-led groups.

    Past ``TRIM_HIGH`` of the window (reply reserve included) it drops oldest groups down
    to ``TRIM_LOW``; between cuts the view only grows, so the server's prompt cache hits.
    """
    pinned, rest = history[:1], history[1:]
    view = pinned + rest[start:]
    if count(view) + budget <= TRIM_HIGH * window:
        return view, start
    while True:  # bounded: start moves strictly forward, at most len(rest) times
        later = [i for i in range(start + 1, len(rest)) if rest[i]["role"] == "user"]
        if not later:
            return pinned + rest[start:], start
        start = later[0]
        view = pinned + rest[start:]
        if count(view) + budget <= TRIM_LOW * window:
            return view, start


# -- one run -------------------------------------------------------------------------------


@dataclass(slots=True)
class Turn:
    index: int
    phase: str  # plant, filler, question
    ok: bool
    seconds: float
    error: str = ""
    status: str = ""  # X-Compaction-Status (proxy)
    degraded: str = ""  # X-Compaction-Degraded (proxy): due a summary, served without one
    version: int = 0
    context_tokens: int = 0  # X-Context-Tokens (proxy's estimate of what it sent)
    prompt_tokens: int = 0  # usage.prompt_tokens (the server's count)
    processed_tokens: int = 0  # timings.prompt_n: prompt tokens not served from cache
    completion_tokens: int = 0
    summary_calls: int = 0  # proxy summaries finished during this turn (from /metrics)
    summary_seconds: float = 0.0
    excerpts: int = 0  # X-Compaction-Recalled (proxy): archived excerpts added to the view
    # proxy counters that moved while the client paused after this turn (--think-seconds):
    # background summaries and slot warm-ups only run in such a pause on one slot
    pause: dict[str, float] = field(default_factory=dict)
    answer: str = ""
    recalled: bool | None = None


@dataclass(slots=True)
class Run:
    scenario: str
    model: str
    window: int
    mode: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    asked: int = 0
    recalled: int = 0
    first_error_turn: int | None = None
    filler_cut_short: bool = False
    seconds: float = 0.0
    paused: float = 0.0  # the client's pauses between turns (--think-seconds), in seconds
    metrics: dict[str, float] = field(default_factory=dict)
    recall_detail: dict[str, bool] = field(default_factory=dict)
    phrasings: dict[str, str] = field(default_factory=dict)  # kind: "date/3", ".../held-out/0"
    server: dict[str, float] = field(default_factory=dict)  # llama-server /metrics deltas
    session: dict[str, Any] = field(default_factory=dict)  # GET /sessions/{id} at the end
    proxy_log: dict[str, Any] = field(default_factory=dict)  # outcomes and warnings

    def summary(self) -> dict[str, Any]:
        secs = sorted(t.seconds for t in self.turns if t.ok)
        statuses = Counter(t.status for t in self.turns if t.status)
        return {
            "scenario": self.scenario,
            "model": self.model,
            "window": self.window,
            "mode": self.mode,
            "seed": self.seed,
            "turns": len(self.turns),
            "error_turns": sum(1 for t in self.turns if not t.ok),
            "first_error_turn": self.first_error_turn,
            "asked": self.asked,
            "recalled": self.recalled,
            "per_kind": dict(self.recall_detail),
            "held_out": sorted(k for k, p in self.phrasings.items() if "/held-out/" in p),
            "excerpt_turns": sum(1 for t in self.turns if t.excerpts),
            "p50_s": percentile(secs, 0.5),
            "p95_s": percentile(secs, 0.95),
            "tokens_sent": sum(t.prompt_tokens for t in self.turns),
            "tokens_processed": sum(t.processed_tokens for t in self.turns),
            # every prompt token the server computed, the proxy's summary calls included
            "server_prompt_tokens": self.server.get("prompt_tokens", 0),
            "server_predicted_tokens": self.server.get("predicted_tokens", 0),
            "summary_calls": self.metrics.get("summaries", 0),
            "summary_seconds": round(self.metrics.get("summary_seconds", 0.0), 1),
            "summary_failures": self.metrics.get("summary_failures", 0),
            "turns_with_summary": sum(1 for t in self.turns if t.summary_calls),
            "statuses": dict(statuses),
            "compaction_outcomes": self.proxy_log.get("outcomes", {}),
            # background summaries and warm-ups by outcome (what single-slot pauses allow)
            "background": {k: v for k, v in self.metrics.items() if k.startswith(BACKGROUND) and v},
            "summary_version": self.session.get("version", 0),
            "summary_tokens": self.session.get("summary_tokens", 0),
            "filler_cut_short": self.filler_cut_short,
            "seconds": round(self.seconds, 1),
            "paused_s": round(self.paused, 1),
        }


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


BACKGROUND = ("precompactions_total{", "slot_warmups_total{", "compactions_by_trigger_total{")
_SERIES = re.compile(r"^(compaction_proxy_[a-z_]+)(\{[^}]*\})? (\S+)$", re.MULTILINE)


def proxy_metrics(base: str) -> dict[str, float]:
    """The proxy's counters that the table reports, from ``/metrics``."""
    text = httpx.get(base + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    raw: dict[str, float] = {}
    for name, labels, value in _SERIES.findall(text):
        raw[name + (labels or "")] = float(value)

    def total(prefix: str, labels: str = "") -> float:
        return sum(v for k, v in raw.items() if k.split("{")[0] == prefix and labels in k)

    out["summaries"] = total("compaction_proxy_summarization_duration_seconds_count")
    out["summary_seconds"] = total("compaction_proxy_summarization_duration_seconds_sum")
    out["summary_failures"] = total("compaction_proxy_summary_failures_total")
    out["summaries_truncated"] = total("compaction_proxy_summaries_truncated_total")
    out["length_retries"] = total("compaction_proxy_summary_length_retries_total")
    out["identifiers_restored"] = total("compaction_proxy_identifiers_restored_total")
    out["inline_waits"] = total("compaction_proxy_inline_summary_waits_total")
    out["overflows"] = total("compaction_proxy_upstream_overflows_total")
    out["precompactions_running"] = total("compaction_proxy_precompactions_running")
    out["summaries_rejected"] = total("compaction_proxy_summaries_rejected_total")
    out["degraded_requests"] = total("compaction_proxy_degraded_requests_total")
    out["failed_summary_seconds"] = total("compaction_proxy_failed_summary_seconds_total")
    out["sent_during_summary"] = total("compaction_proxy_turns_sent_during_summary_total")
    for k, v in raw.items():
        if k.startswith("compaction_proxy_summaries_rejected_total{") and v:
            out[k.removeprefix("compaction_proxy_")] = v
    # The archive's excerpts (absent before it): searches by outcome, excerpts added.
    out["recalled_excerpts"] = total("compaction_proxy_recalled_excerpts_total")
    by_label = (
        "compaction_proxy_compactions_total{",
        "compaction_proxy_recalls_total{",
        *(f"compaction_proxy_{prefix}" for prefix in BACKGROUND),
    )
    for k, v in raw.items():
        if k.startswith(by_label) and v:
            out[k.removeprefix("compaction_proxy_")] = v
    return out


_LLAMA = re.compile(r"^llamacpp:(prompt_tokens_total|tokens_predicted_total) (\S+)$", re.M)


def server_counters(base: str) -> dict[str, float]:
    """llama-server's own totals (``--metrics``): prompt tokens computed, tokens generated."""
    text = httpx.get(base + "/metrics", timeout=10).text
    found = {name: float(value) for name, value in _LLAMA.findall(text)}
    return {
        "prompt_tokens": found.get("prompt_tokens_total", 0.0),
        "predicted_tokens": found.get("tokens_predicted_total", 0.0),
    }


@dataclass(slots=True)
class Step:
    phase: str
    messages: list[dict[str, Any]]  # appended to the history before the request
    max_tokens: int
    check: scenarios.Fact | scenarios.ToolValue | None = None


def facts_script(
    seed: int, window: int, fill: float, reply: int, count: Callable[[str], int]
) -> list[Step]:
    rnd = random.Random(seed)
    planted = scenarios.facts(seed)
    order = list(planted)
    rnd.shuffle(order)
    steps = [Step("plant", [{"role": "user", "content": f.plant}], reply) for f in order]
    total, goal = 0, fill * window
    while total < goal and len(steps) < 400:
        text = scenarios.filler(rnd)
        total += count(text) + reply + 10
        steps.append(Step("filler", [{"role": "user", "content": text}], reply))
    asked = list(planted)
    rnd.shuffle(asked)
    for f in asked:
        msg = {"role": "user", "content": f.question}
        steps.append(Step("question", [msg], QUESTION_TOKENS, f))
    return steps


def agent_script(
    seed: int, window: int, fill: float, reply: int, count: Callable[[str], int]
) -> list[Step]:
    values = scenarios.tool_values(seed)
    probe = scenarios.agent_steps(seed, values, 1)[-1]
    per_step = count(probe.ask) + count(probe.results[0]) + reply + 40
    filler = max(1, int(fill * window / per_step) + 1)
    steps = []
    for s in scenarios.agent_steps(seed, values, min(filler, 300)):
        msgs: list[dict[str, Any]] = [
            {"role": "user", "content": s.ask},
            {"role": "assistant", "content": None, "tool_calls": s.calls},
        ]
        for call, result in zip(s.calls, s.results, strict=True):
            msgs.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        phase = "plant" if s.calls[0]["function"]["name"] == "read_config" else "filler"  # type: ignore[index]
        steps.append(Step(phase, msgs, reply))
    asked = list(values)
    random.Random(seed).shuffle(asked)
    for v in asked:
        steps.append(
            Step("question", [{"role": "user", "content": v.question}], QUESTION_TOKENS, v)
        )
    return steps


def play(
    args: argparse.Namespace,
    scenario: str,
    mode: str,
    window: int,
    seed: int,
    server: str,
    target: str,
    counter: LlamaTokens,
) -> Run:
    """One conversation against one target; stops at the first error when ``direct``."""
    run = Run(scenario, args.model, window, mode, seed)
    tools = scenarios.TOOLS if scenario == "agent" else None
    system = scenarios.AGENT_SYSTEM_PROMPT if tools else scenarios.SYSTEM_PROMPT
    make = agent_script if scenario == "agent" else facts_script
    steps = make(seed, window, args.fill, args.reply_tokens, counter.text_tokens)
    is_proxy = mode.startswith("proxy")
    if mode == "control":
        steps = [s for s in steps if s.phase != "filler"]
    session = f"rb-{scenario}-{window}-{seed}-{time.time_ns()}"
    client = openai.OpenAI(
        base_url=f"{target}/v1",
        api_key="sk-bench",
        max_retries=0,
        timeout=args.request_timeout,
        default_headers={"X-Session-Id": session},
    )

    def count_view(view: list[dict[str, Any]]) -> int:
        return counter.prompt_tokens(view, tools)

    history: list[dict[str, Any]] = [{"role": "system", "content": system}]
    start = 0  # the trimming client's first kept message (after the system prompt)
    before = proxy_metrics(target) if is_proxy else {}
    server_before = server_counters(server)
    last = dict(before)
    began = time.monotonic()

    def active() -> float:  # the budget's clock: the pauses are the scenario's, not its cost
        return time.monotonic() - began - run.paused

    for step in steps:
        if step.phase == "filler" and active() > args.run_seconds:
            run.filler_cut_short = True
            continue
        if active() > 2 * args.run_seconds:
            break  # hard stop: even the questions are past twice the budget
        history.extend(step.messages)
        view = history
        if mode == "trim":
            view, start = trim_view(history, start, step.max_tokens, count_view, window)
        turn = send(client, view, step, tools, len(run.turns) + 1, seed)
        if is_proxy:
            time.sleep(SETTLE_S)
            now = proxy_metrics(target)
            turn.summary_calls = int(now["summaries"] - last["summaries"])
            turn.summary_seconds = round(now["summary_seconds"] - last["summary_seconds"], 2)
            last = now
        run.turns.append(turn)
        if step.check is not None:
            run.asked += 1
            turn.recalled = turn.ok and step.check.recalled(turn.answer)
            run.recalled += int(bool(turn.recalled))
            if isinstance(step.check, scenarios.Fact):
                key = step.check.kind
                run.phrasings[key] = step.check.phrasing
            else:
                key = step.check.key
            run.recall_detail[key] = bool(turn.recalled)
        if turn.ok:
            history.append({"role": "assistant", "content": turn.answer})
        else:
            del history[len(history) - len(step.messages) :]  # the client gives the turn up
            if run.first_error_turn is None:
                run.first_error_turn = turn.index
            if mode == "direct":
                break
        if args.verbose:
            print(
                f"    {mode} turn {turn.index} {turn.phase} {turn.seconds:.1f}s "
                f"{turn.status or ('ok' if turn.ok else 'ERR ' + turn.error[:60])} "
                f"tok={turn.prompt_tokens} {turn.answer[:50]!r}",
                flush=True,
            )
        if args.think_seconds:
            last = think(args.think_seconds, turn, run, target if is_proxy else None, last)
            if args.verbose and turn.pause:
                print(f"      pause after turn {turn.index}: {turn.pause}", flush=True)
    run.seconds = time.monotonic() - began
    if is_proxy:
        time.sleep(1)  # a background summary started by the last turn is counted
        for _ in range(int(args.request_timeout)):
            if not proxy_metrics(target).get("precompactions_running"):
                break
            time.sleep(1)
        after = proxy_metrics(target)
        run.metrics = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        r = httpx.get(
            f"{target}/sessions/{session}",
            headers={"Authorization": "Bearer sk-bench"},
            timeout=10,
        )
        run.session = r.json() if r.status_code == 200 else {"status": r.status_code}
    server_after = server_counters(server)
    run.server = {k: server_after[k] - server_before[k] for k in server_after}
    client.close()
    return run


def think(
    seconds: float, turn: Turn, run: Run, target: str | None, last: dict[str, float]
) -> dict[str, float]:
    """The client reads the answer for ``seconds`` (outside every turn's latency); through
    the proxy, what its counters did meanwhile goes on ``turn``. The counters' new base."""
    began = time.monotonic()
    time.sleep(seconds)
    run.paused += time.monotonic() - began
    if target is None:
        return last
    now = proxy_metrics(target)
    turn.pause = {k: v - last.get(k, 0.0) for k, v in now.items() if v != last.get(k, 0.0)}
    # a gauge: not its change but whether a background summary still runs as the turn comes
    turn.pause.pop("precompactions_running", None)
    if now.get("precompactions_running"):
        turn.pause["running_at_next_turn"] = now["precompactions_running"]
    return now


def send(
    client: openai.OpenAI,
    view: list[dict[str, Any]],
    step: Step,
    tools: Any,
    index: int,
    seed: int,
) -> Turn:
    extra: dict[str, Any] = {}
    if tools:
        extra = {"tools": tools, "tool_choice": "none"}
    started = time.perf_counter()
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=view,  # type: ignore[arg-type]
            max_tokens=step.max_tokens,
            temperature=0,
            seed=seed,
            **extra,
        )
        completion = raw.parse()
    except openai.APIError as exc:
        seconds = time.perf_counter() - started
        return Turn(index, step.phase, False, round(seconds, 3), error=str(exc)[:300])
    seconds = time.perf_counter() - started
    headers = raw.headers
    timings = (completion.model_extra or {}).get("timings") or {}
    usage = completion.usage
    return Turn(
        index,
        step.phase,
        True,
        round(seconds, 3),
        status=headers.get("x-compaction-status", ""),
        degraded=headers.get("x-compaction-degraded", ""),
        version=int(headers.get("x-compaction-version", "0") or 0),
        context_tokens=int(headers.get("x-context-tokens", "0") or 0),
        excerpts=int(headers.get("x-compaction-recalled", "0") or 0),
        prompt_tokens=usage.prompt_tokens if usage else 0,
        processed_tokens=int(timings.get("prompt_n", 0)),
        completion_tokens=usage.completion_tokens if usage else 0,
        answer=(completion.choices[0].message.content or "").strip(),
    )


# -- the report ----------------------------------------------------------------------------


def mode_order(mode: str) -> tuple[int, str]:
    """Table order: control, direct, trim, proxy, then the proxy variants by label."""
    return (MODES.index(mode) if mode in MODES else len(MODES), mode)


def kind_table(rows: list[dict[str, Any]]) -> str:
    """Recall per kind of fact (or tool value) per mode: in how many of the runs it came back.

    ``held-out`` counts the facts planted in a held-out phrasing (``phrasings.HELD_OUT``)
    over all runs of the row: recalled of asked.
    """
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["scenario"], row["model"], row["window"], row["mode"])
        groups.setdefault(key, []).append(row)
    out: list[str] = []
    for scenario in sorted({k[0] for k in groups}):
        keys = [k for k in groups if k[0] == scenario]
        kinds: list[str] = []
        for k in keys:
            for row in groups[k]:
                kinds += [kind for kind in row.get("per_kind", {}) if kind not in kinds]
        if scenario == "facts":
            kinds.sort(key=phrasings.KINDS.index)
        head = "| scenario | model | window | mode | reps | recalled (median) | "
        head += " | ".join(kinds) + " | held-out | p50 vs direct |"
        out += [head, "|" + "---|" * (len(kinds) + 8)]
        for key in sorted(keys, key=lambda k: (k[1], k[2], mode_order(k[3]))):
            items = groups[key]
            cells = []
            for kind in kinds:
                seen = [r["per_kind"][kind] for r in items if kind in r.get("per_kind", {})]
                cells.append(f"{sum(seen)}/{len(seen)}" if seen else "-")
            held_asked = sum(len(r.get("held_out", [])) for r in items)
            held_hit = sum(
                sum(1 for kind in r.get("held_out", []) if r["per_kind"].get(kind)) for r in items
            )
            held = f"{held_hit}/{held_asked}" if held_asked else "-"
            recalled = statistics.median(r["recalled"] for r in items)
            asked = statistics.median(r["asked"] for r in items)
            direct = groups.get((key[0], key[1], key[2], "direct"))
            ratio = "-"
            mine = statistics.median(r["p50_s"] for r in items)
            if direct and (base := statistics.median(r["p50_s"] for r in direct)):
                ratio = f"{mine / base:.1f}x"
            out.append(
                f"| {scenario} | {key[1]} | {key[2]} | {key[3]} | {len(items)} "
                f"| {recalled:g}/{asked:g} | " + " | ".join(cells) + f" | {held} | {ratio} |"
            )
        out.append("")
    return "\n".join(out).rstrip()


def table(rows: list[dict[str, Any]]) -> str:
    """Medians over replicates, per scenario, window and mode."""
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["scenario"], row["model"], row["window"], row["mode"])
        groups.setdefault(key, []).append(row)

    def med(items: list[dict[str, Any]], k: str) -> float:
        values = [r[k] for r in items if r[k] is not None]
        return statistics.median(values) if values else float("nan")

    lines = [
        "| scenario | model | window | mode | reps | recalled | error turns | fails at turn "
        "| turns | p50 s | p95 s | p50 vs direct | summaries (failed) | summary s "
        "| tokens sent | tokens processed | server prompt tokens |",
        "|" + "---|" * 17,
    ]
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], mode_order(k[3]))):
        items = groups[key]
        direct = groups.get((key[0], key[1], key[2], "direct"))
        ratio = "-"
        if direct and med(direct, "p50_s"):
            ratio = f"{med(items, 'p50_s') / med(direct, 'p50_s'):.1f}x"
        asked = med(items, "asked")
        recalled = f"{med(items, 'recalled'):g}/{asked:g}" if asked else "-"
        fails = [r["first_error_turn"] for r in items if r["first_error_turn"] is not None]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(items)} | {recalled} "
            f"| {med(items, 'error_turns'):g} | {statistics.median(fails) if fails else '-'} "
            f"| {med(items, 'turns'):g} | {med(items, 'p50_s'):.1f} | {med(items, 'p95_s'):.1f} "
            f"| {ratio} | {med(items, 'summary_calls'):g} ({med(items, 'summary_failures'):g}) "
            f"| {med(items, 'summary_seconds'):.0f} | {med(items, 'tokens_sent'):g} "
            f"| {med(items, 'tokens_processed'):g} | {med(items, 'server_prompt_tokens'):g} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="0.5b", choices=["0.5b", "1.5b", "135m"])
    parser.add_argument("--scenario", default="facts", help="facts, agent or facts,agent")
    parser.add_argument("--windows", default="4096", help="comma-separated, e.g. 2048,4096")
    parser.add_argument(
        "--modes",
        default="direct,trim,proxy",
        help=f"any of {MODES}; the --proxy-variant modes are added after them",
    )
    parser.add_argument("--replicates", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1, help="first seed; replicates add 1")
    parser.add_argument("--fill", type=float, default=3.0, help="filler, in windows")
    parser.add_argument("--reply-tokens", type=int, default=48, help="max_tokens per turn")
    parser.add_argument("--threads", type=int, default=1, help="llama-server -t")
    parser.add_argument("--parallel", type=int, default=1, help="llama-server -np (1 or 2)")
    parser.add_argument(
        "--cache-reuse",
        type=int,
        default=0,
        help="llama-server --cache-reuse N: reuse cached chunks of at least N tokens by "
        "shifting them (a prompt with turns dropped from its middle; 0: off, llama.cpp's default)",
    )
    parser.add_argument("--run-seconds", type=float, default=600, help="budget per run")
    parser.add_argument("--request-timeout", type=float, default=300)
    parser.add_argument(
        "--think-seconds",
        type=float,
        default=0.0,
        help="the client pauses this long after each turn's answer, in every mode (a person "
        "reading; not in any latency nor in --run-seconds): on one slot, background summaries "
        "start only in such a pause (compaction.precompact.idle_s)",
    )
    parser.add_argument(
        "--proxy-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="proxy config: compaction.summary_timeout_s=90 (section defaults to "
        "compaction; model.KEY sets the bench model's entry: model.precompact=false)",
    )
    parser.add_argument(
        "--proxy-config-extra",
        action="append",
        default=[],
        metavar="YAML",
        help="a YAML mapping (or @file) merged into every proxy mode's generated config, "
        "before --proxy-set: 'compaction: {recall_budget_ratio: 0}'",
    )
    parser.add_argument(
        "--proxy-variant",
        action="append",
        default=[],
        metavar="LABEL:KEY=VALUE,...",
        help="one more mode, proxy-LABEL: the proxy with these --proxy-set settings on top "
        "(no-recall:compaction.recall_budget_ratio=0)",
    )
    parser.add_argument(
        "--capture",
        action="store_true",
        help="keep what each proxy run sends llama-server and gets back "
        "(results/run-*/upstream-WINDOW-PORT-cN.req/.resp, read by tap.messages)",
    )
    parser.add_argument("--server-bin", type=Path, help="default: setup.sh's cache")
    parser.add_argument("--model-path", type=Path, help="default: setup.sh's cache")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per turn")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every server started is stopped by its PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    paths = cached_paths()
    args.server_bin = args.server_bin or paths["server"]
    args.model_path = args.model_path or paths[args.model]
    for need in (args.server_bin, args.model_path):
        if not need.exists():
            raise SystemExit(f"{need} is missing: run bench/realmodel/setup.sh all")
    modes = [m for m in args.modes.split(",") if m]
    extra_modes = variants(args.proxy_variant)
    if bad := [m for m in modes if m not in MODES and m not in extra_modes]:
        raise SystemExit(f"unknown modes {bad}")
    modes += [m for m in extra_modes if m not in modes]
    for extra in args.proxy_config_extra:
        config_extra(extra)  # a typo fails now, not after the first runs
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    workdir = args.out / f"run-{stamp}"
    workdir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    out = args.out / f"{stamp}-{args.model}-{args.scenario.replace(',', '+')}.json"

    def save() -> None:
        document = {
            "date": datetime.now(UTC).isoformat(timespec="minutes"),
            "commit": commit,
            "machine": f"{platform.system()} {platform.machine()} {os.cpu_count()} cpus",
            "args": {k: str(v) for k, v in vars(args).items()},
            "seconds": round(time.monotonic() - started),
            "rows": rows,
            "table": table(rows),
            "kind_table": kind_table(rows),
            "runs": runs,
        }
        out.write_text(json.dumps(document, indent=1))

    for window in (int(w) for w in args.windows.split(",")):
        with llama_server(args, window, workdir) as server:
            counter = LlamaTokens(server)
            for scenario in args.scenario.split(","):
                for rep in range(args.replicates):
                    seed = args.seed + rep
                    for mode in modes:
                        print(f"{scenario} {args.model} {window} {mode} seed {seed}", flush=True)
                        if mode.startswith("proxy"):
                            with proxy(args, window, server, workdir, mode) as target:
                                run = play(
                                    args, scenario, mode, window, seed, server, target, counter
                                )
                            time.sleep(0.2)  # the log writer flushes every 50 ms
                            run.proxy_log = proxy_log(proxy_log_path(workdir, target, window))
                        else:
                            run = play(args, scenario, mode, window, seed, server, server, counter)
                        rows.append(run.summary())
                        runs.append(asdict(run))
                        save()  # after every run: an interrupted invocation keeps its runs
                        s = rows[-1]
                        print(
                            f"  recalled {s['recalled']}/{s['asked']}, {s['turns']} turns, "
                            f"{s['error_turns']} errors (first {s['first_error_turn']}), "
                            f"p50 {s['p50_s']} s, p95 {s['p95_s']} s, summaries "
                            f"{s['summary_calls']:g} ({s['summary_seconds']} s), "
                            f"{s['seconds']} s",
                            flush=True,
                        )
            counter.close()
    print()
    print(table(rows))
    print()
    print(kind_table(rows))
    print(f"\nwrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
