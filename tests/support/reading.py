"""Text as a model reading it takes it, for tests that a summary's forged marks stay
inert: entities decoded, compatibility forms folded (fullwidth ``\\uff1c`` as ``<``),
invisible format characters gone, every line separator a line break. Written apart
from proxy/core/neutral.py's own reading, so the tests do not share its blind spots."""

from __future__ import annotations

import html
import re
import unicodedata

TAG = re.compile(r"<\s*\\?\s*/?\s*summary", re.IGNORECASE)
ROLE_LINE = re.compile(
    r"^\W*(?:\d+[.)])?\W*\[\s*(?:system|developer|user|assistant|tool|function)\b",
    re.IGNORECASE | re.MULTILINE,
)
MARKER = re.compile(r"\[\s*compaction[\s_\-\u2010-\u2015]*proxy", re.IGNORECASE)


def as_read(text: str) -> str:
    """``text`` as a reader takes it (see the module's docstring)."""
    text = unicodedata.normalize("NFKC", html.unescape(text))
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return "\n".join(text.splitlines())
