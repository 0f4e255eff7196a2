"""The README's "Try it without a provider" section and its code blocks, as the demo tests
run them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


SECTION = "## Try it without a provider"
_FENCE = re.compile(r"^```(\S*)\s*$")


def section(readme: str) -> str:
    """The demo section of ``readme``'s text, up to the next ``## `` heading."""
    start = readme[readme.index(SECTION) :]
    return start[: start.index("\n## ", len(SECTION))]


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of ``text``'s fenced code blocks whose info string is ``language``
    (``""``: the blocks that name none). Fences are paired line by line, so a block's
    closing fence is never read as the next one's opening."""
    found: list[str] = []
    body: list[str] | None = None
    info = ""
    for line in text.splitlines(keepends=True):
        fence = _FENCE.match(line)
        if body is None:
            if fence:
                body, info = [], fence.group(1)
        elif fence and not fence.group(1):
            if info == language:
                found.append("".join(body))
            body = None
        else:
            body.append(line)
    return found


def blocks(language: str) -> list[str]:
    """The demo section's code blocks in ``language`` (see ``fenced_blocks``)."""
    return fenced_blocks(section((ROOT / "README.md").read_text()), language)


def excerpt_drift(excerpt: str, output: list[str]) -> list[str]:
    """The lines of ``excerpt`` (``...`` marks what it leaves out) that are not, in
    order, lines of ``output``; empty when the excerpt is an abridged copy of it."""
    drift = []
    at = 0
    for line in excerpt.splitlines():
        if line.strip() == "...":
            continue
        try:
            at = output.index(line, at) + 1
        except ValueError:
            drift.append(line)
    return drift
