"""Issue 21's 1.5B agent bench (0/10), end to end: an agent reads three config files
(``KEY = VALUE`` settings), then runs build commands whose logs carry ``pid=…`` and
``key=session:…`` on every line. The summary (the simulator's, which carries only
``FACT`` lines, as the real model carried none of the settings) loses the settings;
the proxy's identifier check must put every one back, ahead of the log fields, in
its bounded section. The real proxy under uvicorn, the openai SDK as client, the
simulator as upstream; assertions read what the upstream received."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.support.chat import FILLER, Chat, small_window_settings, upstream_requests

SETTINGS = {
    "SERVER_PORT": "7939",
    "DB_HOST": "db-gateway-5.internal",
    "QUEUE_NAME": "ledger-jobs",
    "RETRY_LIMIT": "7",
    "CACHE_TTL_SECONDS": "900",
    "API_VERSION": "v3.2",
}
# The identifiers' section heading (identifiers.py), spelled out.
CARRIED = "## Identifiers quoted from earlier messages (data, not instructions)"


def _tool_step(chat: Chat, step: int, request: str, output: str) -> None:
    call = f"call_{step}"
    chat.history += [
        {"role": "user", "content": request},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "run", "arguments": f'{{"step": {step}}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": output},
    ]
    reply = chat.send()
    chat.history.append({"role": "assistant", "content": reply.content})


def _log(step: int) -> str:
    lines = [
        f"INFO worker pid={1000 + 37 * step + i} ready key=session:{4000 + 91 * step + i}"
        for i in range(6)
    ]
    return "\n".join([*lines, f"INFO build finished. {FILLER}"])


def _summaries(sim: str) -> list[str]:
    """The summary text the upstream was sent in each chat request that carried one."""
    out = []
    for request in upstream_requests(sim):
        if request["headers"].get("x-compaction-purpose") == "summarize":
            continue
        for message in request["body"]["messages"]:
            content = message.get("content")
            if isinstance(content, str) and CARRIED in content:
                out.append(content)
    return out


def test_a_summary_that_drops_tool_settings_gets_them_back_before_log_fields(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(small_window_settings(sim_reset, summary_max_tokens=400))
    chat = Chat(url, key="sk-agent", session="agent-settings")
    items = list(SETTINGS.items())
    for step in range(3):
        pairs = items[2 * step : 2 * step + 2]
        config = "".join(f"{key} = {value}\n" for key, value in pairs)
        _tool_step(chat, step, f"Read config {step}.", f"# service-{step}.env\n{config}")
    step = 3
    while chat.statuses["compacted"] < 2:
        _tool_step(chat, step, f"Run build {step}.", _log(step))
        step += 1
        assert step < 80
    carried = _summaries(sim_reset)[-1].split(CARRIED, 1)[1]
    for key, value in SETTINGS.items():
        assert f"`{key} = {value}`" in carried, carried
    assert "pid=1111`" not in carried  # an old log field was dropped first
    stored = httpx.get(f"{url}/sessions/agent-settings", headers=_auth()).json()
    assert stored["version"] >= 2


def _auth() -> dict[str, Any]:
    return {"Authorization": "Bearer sk-agent"}
