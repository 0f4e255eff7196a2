"""``scripts/demo``: the proxy at work in a minute, with no provider and no key.

Starts the simulator (an OpenAI-compatible model whose context window is
3,000 tokens) and the proxy in front of it, configured, as configs often are,
with a window larger than the model really has (6,000). Then a conversation
through the official ``openai`` SDK plants ``FACT color=blue`` and grows until
the model rejects a request as too long: the proxy learns the real window
from the error, compacts and retries, and the client sees an answer. The
conversation goes on, compacts again on the proxy's own threshold, and ends
with ``RECALL color``, which the simulator answers from the summary only if
the fact survived. Both servers listen on free loopback ports and stop at
the end. Needs the ``demo`` extra (the ``openai`` package).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

MODEL = "sim-demo"
REAL_WINDOW = 3000  # what the simulated model enforces
CONFIGURED_WINDOW = 6000  # what the proxy is told: too large, as configs often are
SESSION = "demo"
# Each turn adds about 250 tokens: a question padded with filler, and a short answer.
PADDING = " ".join(["the plan for this step is to keep working on the task"] * 20)
TURNS = 18  # then RECALL: one overflow recovery and one compaction on the way


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(300):  # 30 s: tokenizers load at start-up
        if process.poll() is not None:
            break
        try:
            _get(url)
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up:\n{log.read_text(errors='replace')}")


@contextmanager
def _served(tmp: Path) -> Iterator[tuple[str, str]]:
    """The simulator and the proxy, running; their base URLs. Stopped on the way out."""
    sim_port, proxy_port = _free_port(), _free_port()
    sim_config = tmp / "sim.yaml"
    sim_config.write_text(
        yaml.safe_dump({"models": [{"match": "sim-*", "context_window": REAL_WINDOW}]})
    )
    proxy_config = tmp / "proxy.yaml"
    proxy_config.write_text(
        yaml.safe_dump(
            {
                "upstream": {"base_url": f"http://127.0.0.1:{sim_port}/v1", "api_key": "sk-sim"},
                "models": [
                    {
                        "match": "sim-*",
                        "context_window": CONFIGURED_WINDOW,
                        "max_output_tokens": 256,
                    }
                ],
                # Inline compactions only, so each one shows on the turn that made it.
                "compaction": {"precompact": {"ratio": None}},
                "logging": {"format": "text", "level": "warning"},
            }
        )
    )
    cli = [sys.executable, "-m", "proxy"]
    commands = {
        "simulator": [*cli, "simulate-upstream", "--config", str(sim_config)],
        "proxy": [*cli, "serve", "--config", str(proxy_config)],
    }
    ports = {"simulator": sim_port, "proxy": proxy_port}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            log = tmp / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [*command, "--host", "127.0.0.1", "--port", str(ports[name])],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            processes.append(process)
            probe = "_sim/stats" if name == "simulator" else "healthz"
            _wait_until_up(f"http://127.0.0.1:{ports[name]}/{probe}", process, log)
        yield f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{proxy_port}"
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _converse(proxy: str) -> None:
    from openai import OpenAI  # the demo extra; imported here so --help needs none of it

    client = OpenAI(
        base_url=f"{proxy}/v1",
        api_key="sk-demo-user",
        default_headers={"X-Session-Id": SESSION},
        max_retries=0,
    )
    history: list[Any] = [{"role": "system", "content": "You are a helpful assistant."}]
    window = CONFIGURED_WINDOW
    print(f"{'turn':>4}  {'X-Compaction-Status':<19}  version  {'X-Context-Tokens / -Window':>26}")
    for turn in range(1, TURNS + 2):
        if turn == 1:
            text = "Remember this: FACT color=blue"
        elif turn <= TURNS:
            text = f"Step {turn}: {PADDING}"
        else:
            text = "RECALL color"
        history.append({"role": "user", "content": text})
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=history)
        answer = raw.parse().choices[0].message.content or ""
        history.append({"role": "assistant", "content": answer})
        h = raw.headers
        status, version = h["x-compaction-status"], h["x-compaction-version"]
        tokens, now = int(h["x-context-tokens"]), int(h["x-context-window"])
        note = ""
        if now < window:
            note = f"  <- overflow recovered: the model allows {REAL_WINDOW}, not {window}"
        elif status == "compacted":
            note = "  <- compacted: summary of the older turns + the recent ones verbatim"
        if turn == 1:
            note = f"  {text}"
        print(f"{turn:>4}  {status:<19}  {version:>7}  {tokens:>12} / {now:<11}{note}".rstrip())
        window = now
        if turn == 1:
            _show_session(proxy)
    print(
        "\npassthrough: the history as sent; compacted: older turns summarized now; "
        "snapshot: the stored summary plus the turns since"
    )
    print(f"\n{text} -> {answer}")


def _show_session(proxy: str) -> None:
    """The session is known from its first turn on (GET /sessions/{id})."""
    request = urllib.request.Request(
        f"{proxy}/sessions/{SESSION}", headers={"Authorization": "Bearer sk-demo-user"}
    )
    for _ in range(50):  # noted just after the answer went out: it may take a moment
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                info = json.loads(response.read())
            break
        except urllib.error.HTTPError:
            time.sleep(0.1)
    else:
        raise RuntimeError(f"GET /sessions/{SESSION} never found the session")
    print(
        f"      GET /sessions/{SESSION}: version {info['version']}, "
        f"{info['messages']} messages, {info['tokens']} tokens, no summary yet"
    )


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="compaction-demo-") as tmp,
        _served(Path(tmp)) as (
            sim,
            proxy,
        ),
    ):
        print(f"simulator: {sim} (a model with a {REAL_WINDOW}-token window)")
        print(f"proxy:     {proxy} (configured with {CONFIGURED_WINDOW} tokens for sim-*)\n")
        _converse(proxy)
        stats = _get(f"{sim}/_sim/stats")
        print(
            f"the simulated model answered {stats['summaries']} summary requests and "
            f"rejected {stats['overflows']} request as too long (the proxy retried it, compacted)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
