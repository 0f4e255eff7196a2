"""Post-compaction regret, counted: an agent that calls the same tool with the same
arguments every turn keeps calling it after a compaction summarized the earlier calls
away; each such call after the view that dropped it is counted, per session and tenant
(``GET /admin/tenants``) and in ``compaction_proxy_regret_tool_calls_total``. The
expected count is worked out here from the simulator's records: what each forwarded
view held of the client's history, and what the model called next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from proxy.config import Settings
from tests.support.chat import FILLER, Chat, small_window_settings, upstream_requests
from tests.support.metrics import metric

pytestmark = pytest.mark.e2e

ADMIN_KEY = "admin-secret"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
]


def _key(call: dict[str, Any]) -> tuple[str, str]:
    return call["function"]["name"], call["function"]["arguments"]


def _calls(messages: list[dict[str, Any]]) -> list[tuple[str | None, tuple[str, str]]]:
    return [
        (call.get("id"), _key(call))
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    ]


def _dropped(history: list[dict[str, Any]], view: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The calls of ``history`` whose assistant message or result ``view`` lacks."""
    shown = {orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in view}

    def seen(m: dict[str, Any]) -> bool:
        return orjson.dumps(m, option=orjson.OPT_SORT_KEYS) in shown

    results = {m["tool_call_id"]: seen(m) for m in history if m["role"] == "tool"}
    return {
        key
        for m in history
        if m["role"] == "assistant"
        for call_id, key in _calls([m])
        if not seen(m) or not results.get(call_id, True)
    }


def test_tool_calls_repeated_after_a_compaction_are_counted(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    settings = small_window_settings(sim_reset).model_dump()
    settings["server"]["admin_key"] = ADMIN_KEY
    url = start_proxy(Settings(**settings))
    chat = Chat(url, session="regret")
    histories: list[list[dict[str, Any]]] = []
    for turn in range(16):
        chat.history.append({"role": "user", "content": f"Turn {turn}: CALL 1. {FILLER}"})
        histories.append([dict(m) for m in chat.history])
        message = chat.send(tools=TOOLS)
        calls = [c.model_dump(exclude_none=True) for c in message.tool_calls or []]
        assert calls
        chat.history.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            chat.history.append({"role": "tool", "tool_call_id": call["id"], "content": FILLER * 2})
        histories.append([dict(m) for m in chat.history])
        answer = chat.send(tools=TOOLS)
        chat.history.append({"role": "assistant", "content": answer.content})
    forwarded = [
        r
        for r in upstream_requests(sim_reset)
        if r["headers"].get("x-compaction-purpose") != "summarize"
    ]
    assert len(forwarded) == len(histories)
    want, gone = 0, set()
    for i, (call, history) in enumerate(zip(forwarded, histories, strict=True)):
        if i:  # the calls the model made since the previous view, among what it dropped
            new = history[len(histories[i - 1]) :]
            want += sum(1 for _, key in _calls(new) if key in gone)
        gone = _dropped(history, call["body"]["messages"])
    assert want > 0  # the compactions did drop calls the agent then made again
    assert metric(url, "compaction_proxy_regret_tool_calls") == want
    auth = {"Authorization": f"Bearer {chat.key}"}
    totals = httpx.get(f"{url}/sessions/regret", headers=auth).json()["ledger"]
    assert totals["regret_tool_calls"] == want
    admin = httpx.get(f"{url}/admin/tenants", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    (tenant,) = admin.json()["data"]
    assert tenant["regret_tool_calls"] == want
