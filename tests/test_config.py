"""The compaction switch as a config file writes it (proxy/config.py, proxy/tenants.py):
``mode`` however YAML spells it, and ``enabled``, the older switch beside it, still read
for one release with a warning at start-up (``proxy.__main__``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.__main__ import _warn_deprecated
from proxy.config import load_settings
from proxy.tenants import PolicyTable

ENTRY_ID = "3f2a9c1b7d4e"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text('upstream: {base_url: "http://127.0.0.1:1/v1"}\n' + text)
    return path


@pytest.mark.parametrize(("written", "mode"), [("off", "off"), ("on", "on"), ('"off"', "off")])
def test_a_bare_on_or_off_is_the_mode_it_names(tmp_path: Path, written: str, mode: str) -> None:
    """YAML 1.1 reads ``mode: off`` unquoted as false: the mode meant, not a 400 saying the
    input should be 'off'."""
    settings = load_settings(write(tmp_path, f"compaction: {{mode: {written}}}\n"))
    assert settings.compaction.effective_mode == mode
    entry = f"tenants: [{{id: {ENTRY_ID}, mode: {written}}}]\n"
    tenants = load_settings(write(tmp_path, entry))
    table = PolicyTable.build(tenants.tenants, tenants.compaction)
    assert table.by_id[ENTRY_ID][1].compaction.effective_mode == mode


def test_enabled_still_works_and_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = load_settings(write(tmp_path, "compaction: {enabled: false}\n"))
    assert old.compaction.effective_mode == "off"
    with caplog.at_level(logging.WARNING, logger="proxy"):
        _warn_deprecated(old)
        _warn_deprecated(
            load_settings(write(tmp_path, f"tenants: [{{id: {ENTRY_ID}, enabled: false}}]\n"))
        )
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "compaction.enabled is deprecated" in said[0]
    assert "compaction.mode" in said[0]
    assert "tenants: an entry's enabled is deprecated" in said[1]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="proxy"):
        _warn_deprecated(load_settings(write(tmp_path, 'compaction: {mode: "off"}\n')))
        _warn_deprecated(load_settings(write(tmp_path, "")))
    assert caplog.records == []
