"""README "Try it without a provider", run as written: ``scripts/demo`` shows an overflow
recovery and a compaction and ends with the recalled fact. Its config and install:
tests/serve/test_demo.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.readme import ROOT, blocks, excerpt_drift


@pytest.mark.e2e
def test_the_readme_demo_runs_as_written_and_shows_what_it_says() -> None:
    command = blocks("bash")[0].strip()
    assert command == "scripts/demo"  # the section's first step, on a fresh clone too
    # The test run's own environment: scripts/_venv.sh finds it installed, nothing to fetch.
    env = {**os.environ, "VENV": sys.prefix}
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    recovered = [line for line in lines if "overflow recovered" in line]
    assert len(recovered) == 1
    assert recovered[0].split()[1] == "compacted"
    assert any(line.split()[1:2] == ["compacted"] and line not in recovered for line in lines)
    assert any("GET /sessions/demo: version 0" in line for line in lines)
    assert lines[-2] == "RECALL color -> color=blue"
    assert "1 request as too long" in lines[-1]
    # The README's excerpt is this output, abridged: its lines, in order.
    excerpt = blocks("")[0]
    assert excerpt.startswith("turn  X-Compaction-Status"), excerpt
    assert excerpt_drift(excerpt, lines) == [], done.stdout
