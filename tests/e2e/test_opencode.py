"""Issue 37 item 8: OpenCode itself (npm ``opencode-ai``, its native binary) in ``run``
mode with an OpenAI-compatible provider at the proxy, the simulator upstream: a session
continued turn after turn (``--continue``), with tool loops, goes through a compaction
and every planted fact is recalled afterwards.

What OpenCode sends is what the proxy must keep: its session named in ``X-Session-Id``
(and ``x-session-affinity``, passed on) on every request, a title request with another system prompt
under the same name (a side request: it must not get or make a summary of its own), ten
tool definitions, streamed answers with usage. OpenCode is told a window far above the
proxy's, so the compacting is the proxy's, not OpenCode's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.chat import FILLER, stats, upstream_requests
from tests.support.servers import proxy_settings

OPENCODE = "1.18.33"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / f"opencode-{OPENCODE}"
WINDOW = 30000


def opencode_binary() -> Path:
    """OpenCode's binary, installed once into .cache (gitignored): the platform package
    npm picks holds it. No npm is a failure, not a skip: CI installs it."""
    npm = shutil.which("npm")
    assert npm, "npm is needed for the OpenCode test (scripts/test installs it)"
    modules = CACHE / "node_modules"
    found = sorted(modules.glob("opencode-linux-*/bin/opencode"))
    if not found:
        subprocess.run(
            [
                *(npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund"),
                f"opencode-ai@{OPENCODE}",
            ],
            check=True,
            timeout=600,
            capture_output=True,
        )
        found = sorted(modules.glob("opencode-linux-*/bin/opencode"))
    assert found, f"no OpenCode binary under {modules}"
    # The plain x64 build needs AVX2; the baseline one runs anywhere.
    return found[0]


def configure(work: Path, proxy: str) -> None:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "proxy": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Proxy",
                "options": {
                    "baseURL": f"{proxy}/v1",
                    "apiKey": "sk-opencode",
                    "headers": {"X-Sim-Context-Window": str(WINDOW)},
                },
                "models": {
                    "sim-oc": {"name": "sim-oc", "limit": {"context": 10**6, "output": 4096}}
                },
            }
        },
        "model": "proxy/sim-oc",
        "autoupdate": False,
        "share": "disabled",
    }
    (work / "opencode.json").write_text(json.dumps(config))


def run_opencode(binary: Path, work: Path, prompt: str, *args: str) -> str:
    """One ``opencode run``; its answer is the text of the last step."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(work.parent),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }
    done = subprocess.run(
        [str(binary), "run", prompt, "--model", "proxy/sim-oc", "--format", "json", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors = [e for e in events if e.get("type") == "error"]
    assert not errors, errors
    texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
    assert texts, done.stdout[-2000:]
    return str(texts[-1]).strip()


def test_opencode_session_through_compactions(
    sim_reset: str, start_proxy: Callable[..., str], tmp_path: Path
) -> None:
    binary = opencode_binary()
    proxy = start_proxy(
        proxy_settings(
            sim_reset,
            models=[{"match": "sim-oc", "context_window": WINDOW, "max_output_tokens": 4096}],
            compaction={"precompact_ratio": None},
        )
    )
    work = tmp_path / "work"
    work.mkdir()
    configure(work, proxy)
    turns = 10
    for turn in range(turns):
        more = ("--continue",) if turn else ()
        # Every other turn a tool loop: the simulator calls OpenCode's first tool (bash)
        # with input it refuses: an error result, no command run.
        call = " CALL 1" if turn % 2 else ""
        text = f"Turn {turn}: {FILLER * 30} FACT k{turn}=v{turn * 7}{call}"
        answer = run_opencode(binary, work, text, *more)
        assert answer == "observed 1 tool results" if call else answer.startswith("ok:")
    asked = " ".join(f"RECALL k{i}" for i in range(turns))
    answer = run_opencode(binary, work, asked, "--continue")
    assert answer == " ".join(f"k{i}=v{i * 7}" for i in range(turns))
    sim = stats(sim_reset)
    assert sim["rejected_structure"] == 0
    assert sim["overflows"] == 0
    assert sim["summaries"] >= 1
    seen = upstream_requests(sim_reset)
    summaries = [r for r in seen if r["headers"].get("x-compaction-purpose") == "summarize"]
    forwarded = [r for r in seen if r not in summaries]
    chats: list[dict[str, Any]] = [r["body"] for r in forwarded if r["body"].get("tools")]
    assert len(chats) == turns + turns // 2 + 1  # a tool loop is two requests
    # OpenCode's own session, named on every request: one name throughout (X-Session-Id
    # is the proxy's and not passed on; x-session-affinity, the same name, is).
    names = {r["headers"].get("x-session-affinity") for r in forwarded}
    assert len(names) == 1, names
    assert None not in names
    # The system prompt and the tools, byte for byte in every request.
    assert len({json.dumps(b["messages"][0]) for b in chats}) == 1
    assert len({json.dumps(b["tools"]) for b in chats}) == 1
    sizes = [len(b["messages"]) for b in chats]
    assert any(later < earlier for earlier, later in pairwise(sizes)), sizes
    # The session is the one OpenCode names: its snapshot is found under that name, and
    # the summaries are all the conversation's (the title request made none).
    (name,) = names
    got = httpx.get(
        f"{proxy}/sessions/{name}", headers={"Authorization": "Bearer sk-opencode"}
    ).json()
    assert got["version"] == sim["summaries"], got
    assert "k0=v0" in got["summary"], got["summary"]


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
