"""The configuration as a file writes it (proxy/config/, proxy/tenants.py): ``mode``
however YAML spells it, and ``enabled``, the older switch beside it; the groups
(``compaction.precompact``, ``backoff``, ``learned_windows``) and the flat keys they
replace, both still read for one release with a warning at start-up (``proxy.__main__``);
the example config setting every key of the schema."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.__main__ import _warn_deprecated
from proxy.config import Settings, load_settings
from proxy.config.tenant_entries import TenantPolicy
from proxy.errors import ConfigError
from proxy.tenants import PolicyTable
from tests.support.docs import ROOT, config_keys

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


# Read for one release, and no longer in the example (__main__ warns when one is set).
DEPRECATED = {"compaction.enabled", "tenants[].enabled"}


def _leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out.add(prefix + key)
    return out


def test_the_example_config_and_the_schema_list_the_same_keys() -> None:
    """config.example.yaml sets every key of the schema (each list of entries: its name,
    the entries' keys in docs/configuration.md), and no key the schema lacks."""
    example = _leaves(yaml.safe_load((ROOT / "config.example.yaml").read_text()))
    schema = set(config_keys(Settings)) - DEPRECATED
    plain = {k for k in schema if "[]" not in k}
    lists = {k.split("[]")[0] for k in schema if "[]" in k}
    assert sorted(plain - example) == []
    assert sorted(example - plain - lists) == []
    assert sorted(lists - example) == []


def test_grouped_keys_are_read_from_yaml_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "compaction:\n"
        "  precompact: {ratio: 0.5, concurrency: 3}\n"
        "  backoff: {first_s: 5, max_s: 50}\n"
        "  learned_windows: {quorum: 1}\n"
    )
    monkeypatch.setenv("PROXY_COMPACTION__PRECOMPACT__RETRY_S", "7")
    c = load_settings(write(tmp_path, text)).compaction
    assert (c.precompact.ratio, c.precompact.concurrency, c.precompact.retry_s) == (0.5, 3, 7)
    assert (c.backoff.first_s, c.backoff.max_s) == (5, 50)
    assert c.learned_windows.quorum == 1
    assert c.learned_windows.ttl_s == 86400  # what the group leaves out keeps its default


def test_the_flat_keys_of_the_last_release_still_work_and_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = "compaction: {precompact_ratio: 0.4, summary_backoff_max_s: 60}\n"
    old = load_settings(write(tmp_path, text))
    assert old.compaction.precompact.ratio == 0.4
    assert old.compaction.backoff.max_s == 60
    with caplog.at_level(logging.WARNING, logger="proxy"):
        _warn_deprecated(old)
    said = sorted(r.getMessage() for r in caplog.records)
    assert len(said) == 2
    assert "compaction.precompact_ratio is deprecated" in said[0]
    assert "set compaction.precompact.ratio" in said[0]
    assert "set compaction.backoff.max_s" in said[1]


def test_a_key_given_flat_and_grouped_is_refused_by_name(tmp_path: Path) -> None:
    text = "compaction: {precompact_ratio: 0.4, precompact: {ratio: 0.5}}\n"
    with pytest.raises(ConfigError, match=r"precompact_ratio is precompact\.ratio"):
        load_settings(write(tmp_path, text))


def test_a_tenant_over_grouped_settings_moves_its_precompact_ratio_with_its_trigger() -> None:
    base = load_settings(compaction={"precompact": {"ratio": 0.6}}).compaction
    table = PolicyTable.build(
        [TenantPolicy(id=ENTRY_ID, trigger_ratio=0.4, target_ratio=0.2)], base
    )
    compaction = table.by_id[ENTRY_ID][1].compaction
    assert compaction.precompact.ratio == 0.3  # the same share of its trigger, 0.75
