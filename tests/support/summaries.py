"""The proxy's settings for the summary check's small window (tests/core/test_summary_check.py
and its end-to-end part)."""

from __future__ import annotations

from typing import Any

from tests.support.servers import proxy_settings

WINDOW = 4096


def settings(sim: str, **compaction: Any) -> Any:
    return proxy_settings(
        sim,
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None, **compaction},
    )
