"""ModelTable's cache of resolved models: the least recently used goes first, and a model
resolved lately is not resolved again."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Settings
from proxy.core import models
from proxy.core.models import ModelTable


def test_the_least_recently_used_model_is_the_one_forgotten(monkeypatch: Any) -> None:
    monkeypatch.setattr(models, "_CACHE_LIMIT", 3)
    table = ModelTable(Settings(upstream={"base_url": "http://127.0.0.1:1/v1"}))
    resolved: list[str] = []
    own = table._resolve

    def counted(model: str) -> Any:
        resolved.append(model)
        return own(model)

    monkeypatch.setattr(table, "_resolve", counted)
    first = table.resolve("a")
    for name in ("b", "c", "a", "d"):  # "a" used again: "b" is the least recent at "d"
        table.resolve(name)
    assert resolved == ["a", "b", "c", "d"]
    assert table.resolve("a") is first  # kept: not resolved again
    assert table.resolve("c").name == "c"
    assert resolved == ["a", "b", "c", "d"]
    table.resolve("b")  # forgotten at "d": resolved anew, and "d" goes now
    table.resolve("d")
    assert resolved == ["a", "b", "c", "d", "b", "d"]
    assert len(table._cache) == 3


@pytest.mark.parametrize("name", ["gpt-4o", "unknown-model"])
def test_a_model_resolves_to_the_same_spec_every_time(name: str) -> None:
    table = ModelTable(Settings(upstream={"base_url": "http://127.0.0.1:1/v1"}))
    assert table.resolve(name) is table.resolve(name)
    assert table.resolve(name) == table._resolve(name)
