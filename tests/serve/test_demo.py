"""README "Try it without a provider": the manual steps' config is valid, and the install
the demo relies on (scripts/_venv.sh) holds what it needs.

``scripts/demo`` run as written: tests/e2e/test_demo_e2e.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from proxy.config import load_settings
from tests.support.readme import ROOT, _blocks


def test_the_readme_manual_config_is_valid(tmp_path: Path) -> None:
    manual = _blocks("bash")[1]
    config = re.search(r"<<'EOF'\n(.*?)\nEOF", manual, re.S)
    assert config is not None
    path = tmp_path / "sim.yaml"
    path.write_text(config.group(1))
    settings = load_settings(str(path))
    assert settings.upstream.base_url == "http://127.0.0.1:8081/v1"
    assert settings.models[0].match == "sim-*"


def test_the_test_extra_holds_every_other_extras_packages() -> None:
    # scripts/_venv.sh serves `scripts/demo` (extra demo) from a test install.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    test = set(extras.pop("test"))
    for name, packages in extras.items():
        assert set(packages) <= test, name
