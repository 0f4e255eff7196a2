"""An overflow reported inside a 200 event stream is recovered like a 400 (issue 8), end
to end. Which events are errors, in-process: tests/upstream/test_stream_overflow.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson

from tests.support.chat import chat_requests
from tests.support.servers import proxy_settings
from tests.support.streams import REAL, long_history


def stream(url: str, headers: dict[str, str]) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    body = {"model": "sim-big", "messages": long_history(), "stream": True}
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": "Bearer sk-a", **headers},
        timeout=30,
    )
    assert r.status_code == 200
    events = [
        orjson.loads(line[6:])
        for line in r.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return r.headers, events


def test_an_overflow_in_the_first_event_is_recovered_before_any_byte_is_sent(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        proxy_settings(
            sim_reset,
            models=[{"match": "sim-big", "context_window": 32768, "max_output_tokens": 256}],
        )
    )
    sim = {"X-Sim-Context-Window": str(REAL), "X-Sim-Errors-In-Stream": "1"}
    # Directly, the simulator answers 200 and puts the overflow in the stream.
    direct = httpx.post(
        f"{sim_reset}/v1/chat/completions",
        json={"model": "sim-big", "messages": long_history(), "stream": True},
        headers=sim,
    )
    assert direct.status_code == 200
    assert "maximum context length" in direct.text
    httpx.delete(f"{sim_reset}/_sim/requests")

    headers, events = stream(url, sim)
    assert events
    assert all("error" not in e for e in events), events[0]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert headers["x-compaction-status"] in ("trimmed", "compacted")
    sent = chat_requests(sim_reset)
    assert len(sent) == 2  # the stream that failed, then exactly one retry
    assert len(orjson.dumps(sent[1]["body"]["messages"])) < len(orjson.dumps(long_history()))


def test_a_stream_that_fits_is_relayed_untouched(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset))
    body = {"model": "sim-big", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    direct = httpx.post(f"{sim_reset}/v1/chat/completions", json=body)
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Sim-Errors-In-Stream": "1"})
    assert r.content == direct.content
    assert len(chat_requests(sim_reset)) == 2
