"""Issue 25: Claude Code itself (npm ``@anthropic-ai/claude-code``, its native binary) in
print mode with ``ANTHROPIC_BASE_URL`` at the proxy, the simulator's Messages API
upstream: a session resumed turn after turn (``--resume``), with tool loops under
adaptive thinking, goes through a compaction and every planted fact is recalled
afterwards.

What Claude Code sends is what the proxy must keep valid: ``system`` blocks with
``cache_control``, 20-odd tool definitions, ``system`` messages between turns (the
``mid-conversation-system`` beta), ``context_management`` with a ``clear_thinking`` edit,
adaptive thinking, and its session id inside ``metadata.user_id``.
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

import pytest

from tests.support.chat import FILLER, stats, upstream_requests
from tests.support.servers import proxy_settings

CLAUDE_CODE = "2.1.197"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / f"claude-code-{CLAUDE_CODE}"
SESSION = "11111111-2222-4333-8444-555555555555"
WINDOW = 40000


def claude_binary() -> Path:
    """Claude Code's binary, installed once into .cache (gitignored). The package's
    postinstall (which puts the platform's binary in place) is run by hand: npm may hold
    install scripts back. No npm is a failure, not a skip: CI installs it."""
    npm = shutil.which("npm")
    assert npm, "npm is needed for the Claude Code test (scripts/test installs it)"
    package = CACHE / "node_modules" / "@anthropic-ai" / "claude-code"
    binary = package / "bin" / "claude.exe"
    if not binary.exists() or binary.stat().st_size < 1_000_000:
        subprocess.run(
            [
                *(npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund"),
                f"@anthropic-ai/claude-code@{CLAUDE_CODE}",
            ],
            check=True,
            timeout=600,
            capture_output=True,
        )
        subprocess.run(
            ["node", "install.cjs"], cwd=package, check=True, timeout=120, capture_output=True
        )
    return binary


def run_claude(binary: Path, proxy: str, home: Path, prompt: str, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy,
        "ANTHROPIC_API_KEY": "sk-ant-claude-code",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "ANTHROPIC_CUSTOM_HEADERS": f"X-Sim-Context-Window: {WINDOW}",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = subprocess.run(
        [str(binary), "-p", prompt, "--model", "sim-cc", *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    return done.stdout.strip()


def test_claude_code_session_through_compactions(
    sim_reset: str, start_proxy: Callable[..., str], tmp_path: Path
) -> None:
    binary = claude_binary()
    proxy = start_proxy(
        proxy_settings(
            sim_reset,
            upstream={"summarizer_api": "messages"},
            models=[{"match": "sim-cc", "context_window": WINDOW, "max_output_tokens": 4096}],
            compaction={"precompact_ratio": None, "pin_user_prefixes": ["<system-reminder>"]},
        )
    )
    turns = 10
    for turn in range(turns):
        resume = ("--session-id", SESSION) if turn == 0 else ("--resume", SESSION)
        # Every other turn a tool loop: the simulator calls Claude Code's first tool
        # (with input it refuses: an error result, no side effect), adaptive thinking on.
        call = " CALL 1" if turn % 2 else ""
        text = f"Turn {turn}: {FILLER * 20} FACT k{turn}=v{turn * 7}{call}"
        answer = run_claude(binary, proxy, tmp_path, text, *resume)
        expected = "observed 1 tool results" if call else answer
        assert answer == expected
        assert call or answer.startswith("ok:")
    asked = " ".join(f"RECALL k{i}" for i in range(turns))
    answer = run_claude(binary, proxy, tmp_path, asked, "--resume", SESSION)
    assert answer == " ".join(f"k{i}=v{i * 7}" for i in range(turns))
    sim = stats(sim_reset)
    assert sim["rejected_structure"] == 0
    assert sim["overflows"] == 0
    assert sim["summaries"] >= 1
    forwarded = [
        r
        for r in upstream_requests(sim_reset)
        if "tools" in r["body"] and r["headers"].get("x-compaction-purpose") != "summarize"
    ]
    requests: list[dict[str, Any]] = [r["body"] for r in forwarded]
    assert len(requests) == turns + turns // 2 + 1  # a tool loop is two requests
    # The system blocks and the tools, byte for byte in every request.
    assert len({json.dumps(b["system"]) for b in requests}) == 1
    assert len({json.dumps(b["tools"]) for b in requests}) == 1
    # Claude Code's session, named in metadata.user_id: one session throughout.
    assert {json.loads(b["metadata"]["user_id"])["session_id"] for b in requests} == {SESSION}
    # Its opening (a system reminder, and the system message after it) stays pinned.
    openings = {json.dumps(b["messages"][:2]) for b in requests[1:]}
    assert len(openings) == 1
    sizes = [len(b["messages"]) for b in requests]
    assert any(later < earlier for earlier, later in pairwise(sizes)), sizes


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
