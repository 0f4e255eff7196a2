"""The docs keep up with the tree: the architecture page lists every module of ``proxy/``
(but the simulator's), the configuration page every key of the settings schema, and the
README stays the front door (the site itself is built with ``--strict`` by scripts/lint)."""

from __future__ import annotations

import re

from pydantic import BaseModel

from proxy.config import Settings
from tests.support.docs import ROOT, config_keys, modules, page


def test_the_architecture_page_lists_every_module() -> None:
    listed = set(re.findall(r"^- `(proxy/[\w/]+\.py)`: \S", page("architecture.md"), re.M))
    missing = [m for m in modules() if m not in listed]
    assert not missing, f"add a line for each to docs/architecture.md 'Every module': {missing}"
    gone = sorted(listed - set(modules()))
    assert not gone, f"docs/architecture.md lists modules that no longer exist: {gone}"


def test_the_configuration_page_names_every_key_of_the_schema() -> None:
    named = set(re.findall(r"^\| `([\w.\[\]]+)` \|", page("configuration.md"), re.M))
    keys = config_keys(Settings)
    missing = [k for k in keys if k not in named]
    assert not missing, f"add a row for each to docs/configuration.md 'Every key': {missing}"
    gone = sorted(named - set(keys))
    assert not gone, f"docs/configuration.md names keys the schema does not have: {gone}"


class _Inner(BaseModel):
    a: int = 1
    b: list[str] = []


class _Entry(BaseModel):
    match: str


class _Outer(BaseModel):
    inner: _Inner = _Inner()
    entries: list[_Entry] = []
    optional: _Inner | None = None
    flag: bool = False


def test_config_keys_walk_sections_lists_and_optional_sections() -> None:
    assert config_keys(_Outer) == [
        "inner.a",
        "inner.b",
        "entries[].match",
        "optional.a",
        "optional.b",
        "flag",
    ]


def test_the_readme_is_the_front_door() -> None:
    """About 200 lines (at most 250), and every docs page it links to exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", readme):
        assert (ROOT / target).is_file(), target
