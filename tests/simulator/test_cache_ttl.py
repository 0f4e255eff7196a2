"""The simulator's prompt caches expire and bill as the providers do: OpenAI's
(prompt_cache.py) after its TTL, Anthropic's (anthropic_cache.py) after 5 minutes or
an hour by the breakpoint's ``ttl``, writes split by tier in ``usage.cache_creation``,
and each request's outcome (hit, ttl_expiry, cold_start, prefix_change) in its record."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.simulator import SimulatorConfig, create_simulator_app
from proxy.simulator.anthropic_cache import AnthropicCache
from proxy.simulator.prompt_cache import PromptCache
from tests.support.servers import run_server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _blocks(*names: str) -> list[tuple[object, int]]:
    return [({"role": "user", "content": name}, 600) for name in names]


def test_openai_prefixes_expire_after_the_ttl_and_say_why() -> None:
    clock = Clock()
    cache = PromptCache(ttl_s=300, min_tokens=1024, increment=128, clock=clock)
    assert cache.lookup("k", _blocks("a", "b"), 1200) == (0, "cold_start")
    clock.now += 299
    assert cache.lookup("k", _blocks("a", "b", "c"), 1800) == (1152, "hit")
    clock.now += 301  # idle past the TTL: the prefix is gone, and the record says so
    assert cache.lookup("k", _blocks("a", "b", "c", "d"), 2400) == (0, "ttl_expiry")
    clock.now += 10  # a prefix that an earlier prompt went on from differently
    assert cache.lookup("k", _blocks("a", "x"), 1200) == (0, "prefix_change")
    assert cache.lookup("other", _blocks("a", "b"), 1200) == (0, "cold_start")  # per key


def _body(*texts: str, ttl: str | None = None) -> dict[str, Any]:
    control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    messages: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        block: dict[str, Any] = {"type": "text", "text": text * 50}
        if i == len(texts) - 1:
            block["cache_control"] = control
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    return {"messages": messages}


def _tiers(usage: dict[str, Any]) -> tuple[int, int, int]:
    tiers = usage["cache_creation"]
    assert usage["cache_creation_input_tokens"] == sum(tiers.values())
    pair = (tiers["ephemeral_5m_input_tokens"], tiers["ephemeral_1h_input_tokens"])
    return usage["cache_read_input_tokens"], *pair


def test_anthropic_writes_are_billed_by_tier_and_expire_by_it() -> None:
    clock = Clock()
    cache = AnthropicCache(300, 3600, clock=clock)
    usage, outcome = cache.usage(_body("a "), 1000)
    assert outcome == "cold_start"
    assert _tiers(usage) == (0, 1000, 0)
    clock.now += 200
    usage, outcome = cache.usage(_body("a ", "b "), 2000)
    assert outcome == "hit"
    read, short, long = _tiers(usage)
    assert read > 0
    assert (short, long) == (2000 - read, 0)
    clock.now += 301  # the 5-minute tier has gone
    usage, outcome = cache.usage(_body("a ", "b ", "c "), 3000)
    assert outcome == "ttl_expiry"
    assert _tiers(usage)[0] == 0
    # An hour's breakpoint: written at the 1h tier, alive past 5 minutes, not past an hour.
    usage, outcome = cache.usage(_body("x ", ttl="1h"), 1000)
    assert outcome == "cold_start"
    assert _tiers(usage) == (0, 0, 1000)
    clock.now += 1800
    usage, outcome = cache.usage(_body("x ", "y ", ttl="1h"), 2000)
    assert outcome == "hit"
    assert _tiers(usage)[0] > 0
    clock.now += 3601
    assert cache.usage(_body("x ", "y ", "z ", ttl="1h"), 3000)[1] == "ttl_expiry"
    # A prompt that leaves an earlier one's path after its cached system prompt (a
    # breakpoint of its own), within the TTL: a prefix change.
    system = [{"type": "text", "text": "rules " * 50, "cache_control": {"type": "ephemeral"}}]
    cache.usage({**_body("p ", "q "), "system": system}, 2000)
    usage, outcome = cache.usage({**_body("p ", "r "), "system": system}, 2000)
    assert outcome == "prefix_change"
    assert _tiers(usage)[0] > 0  # the system prompt still read
    # Without a breakpoint of its own, what was sent before is still no cold start.
    cache.usage(_body("s ", "t ", "u "), 2000)
    assert cache.usage(_body("s ", "v "), 2000) == (_usage_of(2000), "prefix_change")


def _usage_of(written: int) -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": written,
        "cache_creation": {"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0},
    }


@pytest.mark.e2e
def test_the_billing_record_carries_each_requests_cache_outcome() -> None:
    config = SimulatorConfig.model_validate({"reply_tokens": 8})
    with run_server(create_simulator_app(config)) as url, httpx.Client(base_url=url) as http:
        http.delete("/_sim/requests")
        history: list[dict[str, Any]] = []
        for text in ("first " * 300, "second " * 300):
            history.append({"role": "user", "content": text})
            r = http.post("/v1/chat/completions", json={"model": "m", "messages": history})
            history.append(r.json()["choices"][0]["message"])
        system = [{"type": "text", "text": "rules " * 300, "cache_control": {"type": "ephemeral"}}]
        body = {"model": "m", "max_tokens": 16, "system": system}
        r = http.post("/v1/messages", json={**body, "messages": [{"role": "user", "content": "q"}]})
        assert r.json()["usage"]["cache_creation"]["ephemeral_5m_input_tokens"] > 0
        records = http.get("/_sim/requests").json()
        assert [r["cache"] for r in records] == ["cold_start", "hit", "cold_start"]
