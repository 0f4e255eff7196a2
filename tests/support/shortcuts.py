"""Framework shortcuts on or off inside one test (proxy/shortcuts/gate.py).

``switch(monkeypatch, on)`` sets ``COMPACTION_PROXY_SHORTCUTS`` for what the test builds
from then on (an app, an upstream client, a protocol) and forgets the gate's decisions;
``monkeypatch`` puts the variable back, and ``tests/conftest.py`` forgets the decisions
again once the test ends (``forget_if_switched``), so the next test decides afresh.
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


def off_for_the_run() -> bool:
    """Whether the run was started with every shortcut off (the environment's switch)."""
    import os

    return gate.decide("uvicorn", "0.54.0", os.environ.get(gate.SWITCH)) is not None
