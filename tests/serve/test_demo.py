"""README "Try it without a provider": the manual steps' config is valid, and the install
the demo relies on (scripts/_venv.sh) holds what it needs.

``scripts/demo`` run as written: tests/e2e/test_demo_e2e.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from proxy.config import load_settings
from tests.support.readme import ROOT, blocks, excerpt_drift, fenced_blocks


def test_the_readme_manual_config_is_valid(tmp_path: Path) -> None:
    manual = blocks("bash")[1]
    config = re.search(r"<<'EOF'\n(.*?)\nEOF", manual, re.S)
    assert config is not None
    path = tmp_path / "sim.yaml"
    path.write_text(config.group(1))
    settings = load_settings(str(path))
    assert settings.upstream.base_url == "http://127.0.0.1:8081/v1"
    assert settings.models[0].match == "sim-*"


def test_the_readme_output_excerpt_is_the_block_after_the_command() -> None:
    # Paired line by line: the command block's closing fence is not an opening one.
    assert fenced_blocks("```bash\nx\n```\n\n```\nout\n```\n", "") == ["out\n"]
    assert blocks("")[0].startswith("turn  X-Compaction-Status")


def test_a_drifted_or_reordered_excerpt_is_told_apart_from_an_abridged_one() -> None:
    output = ["turn 1", "turn 2", "turn 3", "RECALL"]
    assert excerpt_drift("turn 1\n ...\nturn 3\nRECALL\n", output) == []
    assert excerpt_drift("turn 1\nturn 9\n", output) == ["turn 9"]
    assert excerpt_drift("turn 3\nturn 1\n", output) == ["turn 1"]


def test_the_test_extra_holds_every_other_extras_packages() -> None:
    # scripts/_venv.sh serves `scripts/demo` (extra demo) from a test install.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    test = set(extras.pop("test"))
    for name, packages in extras.items():
        assert set(packages) <= test, name
