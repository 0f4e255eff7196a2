"""The README's "Try it without a provider" section and its code blocks, as the demo tests
run them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


SECTION = "## Try it without a provider"


def _blocks(language: str) -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)
