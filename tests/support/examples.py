"""How many examples a property test runs, under the Hypothesis profile tests/conftest.py
loaded (``fast`` by default, ``thorough`` for the whole suite)."""

from __future__ import annotations

from hypothesis import settings


def examples(thorough: int) -> int:
    """How many examples a property runs: ``thorough`` under the thorough profile."""
    return max(10, thorough * settings.default.max_examples // 100)
