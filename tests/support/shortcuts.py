"""Framework shortcuts on or off inside one test (proxy/shortcuts/gate.py).

``switch(monkeypatch, on)`` sets ``COMPACTION_PROXY_SHORTCUTS`` for what the test builds
from then on (an app, an upstream client, a protocol) and forgets the gate's decisions;
``monkeypatch`` puts the variable back, and ``tests/conftest.py`` forgets the decisions
again once the test ends (``forget_if_switched``), so the next test decides afresh.
``pretend(monkeypatch, starlette="1.11.0")`` makes the gate see another release.
"""

from __future__ import annotations

import pytest

from proxy.shortcuts import gate

_switched = [False]


def switch(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    if on:
        monkeypatch.delenv(gate.SWITCH, raising=False)
    else:
        monkeypatch.setenv(gate.SWITCH, "off")
    gate.on.cache_clear()
    _switched[0] = True


def forget_if_switched() -> None:
    if _switched[0]:
        _switched[0] = False
        gate.on.cache_clear()


def pretend(monkeypatch: pytest.MonkeyPatch, **versions: str) -> None:
    """The gate sees these releases installed (``starlette="1.11.0"``), the others as
    they are, from now on in this test."""
    real = gate.metadata.version

    def version(name: str) -> str:
        return versions.get(name) or real(name)

    monkeypatch.setattr(gate.metadata, "version", version)
    monkeypatch.delenv(gate.SWITCH, raising=False)
    gate.on.cache_clear()
    _switched[0] = True
