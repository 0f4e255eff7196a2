"""server.workers: the setting's bounds (proxy.serve.workers).

Worker processes serving for real: tests/e2e/test_workers_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import Settings, load_settings
from proxy.errors import ConfigError


def test_workers_must_be_at_least_one(tmp_path: Path) -> None:
    assert Settings().server.workers == 1
    path = tmp_path / "config.yaml"
    path.write_text("server: {workers: 0}\n")
    with pytest.raises(ConfigError, match=r"server\.workers"):
        load_settings(path)
