"""A summarizer's answer is vetted in a worker thread, however short
(compaction/vetting.py), and neutralising it looks closely only at lines that could read
as the proxy's own (core/neutral.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from proxy.compaction import vetting
from proxy.core import neutral
from proxy.core.prompts import prompt_for
from proxy.core.wording import CARRIED_HEADING, HANDOFF_INTRO

SHORT = "## Goal\nship the release\n"


def spying(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Replaces ``vetting.<name>`` by a wrapper that records the thread it runs in."""
    threads: list[int] = []
    work: Callable[..., Any] = getattr(vetting, name)

    def spy(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return work(*args)

    monkeypatch.setattr(vetting, name, spy)
    return threads


async def test_a_short_answer_is_vetted_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = spying(monkeypatch, "check_summary")
    compared = spying(monkeypatch, "echoes")
    neutralised = spying(monkeypatch, "neutralised")
    prompt = prompt_for(400)
    await vetting.rejection(SHORT, prompt, 400, 10_000)
    await vetting.echoed(SHORT, prompt)
    await vetting.kept(SHORT)
    loop = threading.get_ident()
    assert checked
    assert compared
    assert neutralised
    assert loop not in checked + compared + neutralised


def test_lines_too_short_or_too_long_to_be_the_proxys_own_are_not_read_closely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = neutral._plain
    seen: list[str] = []

    def spy(line: str) -> str:
        seen.append(line)
        return plain(line)

    monkeypatch.setattr(neutral, "_plain", spy)
    text = "\n".join(["- a short point", "x" * 5_000] * 1_000)
    assert neutral.neutralised(text) == text
    assert seen == []
    own = f"{text}\n{HANDOFF_INTRO.upper()}\n{CARRIED_HEADING}x"
    assert neutral.OPEN + HANDOFF_INTRO.upper() in neutral.neutralised(own)
    assert seen  # a line of the right length is still read closely
