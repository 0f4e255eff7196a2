"""The Responses API end to end: proxy settings for the simulator's models, and the
invariants of an item list."""

from __future__ import annotations

from typing import Any

from tests.support.servers import proxy_settings

WINDOW = 8192


def settings(sim: str, window: int = WINDOW, **compaction: Any) -> Any:
    return proxy_settings(
        sim,
        models=[{"match": "sim-*", "context_window": window, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None, **compaction},
    )


def check_items(items: list[dict[str, Any]]) -> None:
    """Every output answers a call before it, every call is answered, and reasoning
    is followed by what it produced."""
    called = {i["call_id"] for i in items if i.get("type") == "function_call"}
    answered = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert called == answered
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            seen.add(item["call_id"])
        if item.get("type") == "function_call_output":
            assert item["call_id"] in seen
        if item.get("type") == "reasoning":
            assert items[i + 1]["type"] in ("function_call", "message")
