"""Codex CLI (npm ``@openai/codex``, its native binary) in ``exec`` mode through the
proxy against the simulator, with remote compaction forced on: issue 25's acceptance
client for OpenAI's compaction contract served for a non-OpenAI upstream.

Codex compacts remotely for a provider named ``OpenAI`` (``name = "OpenAI"`` on a
custom provider whose ``base_url`` is the proxy), sending its history with a
``compaction_trigger`` last (remote compaction v2) and wanting exactly one
``compaction`` item back. ``model_auto_compact_token_limit`` far below the first
turn's usage makes the second turn (``exec resume --last``) compact first. The proxy
(``upstream.compaction: auto``, the simulator is not OpenAI) answers the trigger itself;
the turn after it carries the item, which the upstream sees expanded to the summary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.core.wording import HANDOFF_INTRO
from tests.support.chat import chat_requests, stats
from tests.support.servers import proxy_settings

VERSION = "0.169.0"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / f"codex-{VERSION}"
PACKAGE = f"@openai/codex@{VERSION}"
_TIMEOUT_S = 120


def _codex() -> Path:
    """The Codex binary, installed once into .cache (gitignored) with npm. No npm is a
    failure, not a skip: CI installs node (scripts/test)."""
    npm = shutil.which("npm")
    assert npm, "npm is needed for the Codex CLI test (scripts/test installs it)"
    vendor = CACHE / "node_modules" / "@openai"
    found = sorted(vendor.glob("codex-*/vendor/*/bin/codex"))
    if not found:
        subprocess.run(
            [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", PACKAGE],
            check=True,
            timeout=300,
            capture_output=True,
        )
        found = sorted(vendor.glob("codex-*/vendor/*/bin/codex"))
    assert found, f"no native codex binary under {vendor}"
    return found[0]


def _config(home: Path, proxy: str) -> None:
    home.mkdir()
    (home / "config.toml").write_text(
        "\n".join(
            [
                'model = "gpt-4o"',
                'model_provider = "sim"',
                "model_auto_compact_token_limit = 2000",
                "model_context_window = 128000",
                "check_for_update_on_startup = false",
                "[model_providers.sim]",
                'name = "OpenAI"  # remote compaction is for OpenAI-named providers',
                f'base_url = "{proxy}/v1"',
                'wire_api = "responses"',
                'env_key = "SIM_API_KEY"',
                "supports_websockets = false",
                "request_max_retries = 0",
                "stream_max_retries = 0",
                "",
            ]
        )
    )


@pytest.mark.parametrize("mode", ["auto", "passthrough"])
def test_codex_exec_compacts_remotely_through_the_proxy(
    sim_reset: str, start_proxy: Callable[..., str], tmp_path: Path, mode: str
) -> None:
    """``auto`` (the simulator is no OpenAI): the proxy answers the trigger; with
    ``passthrough`` the simulator does, as api.openai.com would."""
    codex = _codex()
    upstream = {"compaction": mode}
    settings = proxy_settings(sim_reset, upstream=upstream, compaction={"force_interval_s": 0})
    proxy = start_proxy(settings)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    _config(home, proxy)
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "SIM_API_KEY": "sk-codex"}
    base = [str(codex), "exec", "--skip-git-repo-check", "-s", "read-only"]

    def run(*args: str) -> tuple[str, str]:
        """The final answer (stdout) and the session's transcript (stderr)."""
        done = subprocess.run(
            [*base, *args],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout, done.stderr

    run("Say hello. FACT code=k7q2")
    answer, transcript = run("resume", "--last", "RECALL code")
    assert "context compacted" in transcript
    assert answer.strip() == "code=k7q2"
    inputs = [r["body"]["input"] for r in chat_requests(sim_reset)]
    after = inputs[-1]
    assert stats(sim_reset)["rejected_structure"] == 0
    if mode == "passthrough":  # the trigger went upstream; its item came back there
        assert len(inputs) == 3
        assert inputs[1][-1] == {"type": "compaction_trigger"}
        assert stats(sim_reset)["compactions"] == 1
        assert any(item.get("type") == "compaction" for item in after)
        return
    assert len(inputs) == 2  # the two turns; the trigger was the proxy's to answer
    assert all(item.get("type") != "compaction_trigger" for items in inputs for item in items)
    assert all(item.get("type") != "compaction" for item in after)  # expanded
    assert any(HANDOFF_INTRO in str(item.get("content")) for item in after)
    assert stats(sim_reset)["summaries"] >= 1
    assert stats(sim_reset)["compactions"] == 0
