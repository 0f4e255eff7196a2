"""The simulator's prompt caching (prompt_cache.py): OpenAI's rules, modelled per API key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.core.encodings import load_encoders
from proxy.simulator import SimulatorConfig, create_simulator_app
from proxy.simulator.counting import PromptCounter
from proxy.simulator.prompt_cache import cached_share
from tests.support.servers import run_server

CONFIG = SimulatorConfig.model_validate({"reply_tokens": 8})
# About 700 tokens each: two make a prefix past the 1024-token minimum.
OPENING: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse. " + "alpha beta gamma " * 230},
    {"role": "user", "content": "Remember: " + "delta epsilon zeta " * 230},
]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with run_server(create_simulator_app(CONFIG)) as url, httpx.Client(base_url=url) as client:
        client.delete("/_sim/requests")
        yield client


def _counter() -> PromptCounter:
    return PromptCounter(load_encoders(["cl100k_base"])["cl100k_base"])


def _chat(http: httpx.Client, messages: list[Any], key: str = "sk-a") -> dict[str, Any]:
    r = http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": messages},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    usage: dict[str, Any] = r.json()["usage"]
    return usage


def test_the_rule_has_a_minimum_and_steps_of_128() -> None:
    assert cached_share(1023, 5000, 1024, 128) == 0
    assert cached_share(1024, 5000, 1024, 128) == 1024
    assert cached_share(1300, 5000, 1024, 128) == 1280
    assert cached_share(2000, 1000, 1024, 128) == 0  # a prompt below the minimum


def test_a_repeated_prefix_of_the_same_key_is_cached(http: httpx.Client) -> None:
    http.delete("/_sim/requests")
    first = _chat(http, [*OPENING, {"role": "user", "content": "one"}])
    assert first["prompt_tokens_details"]["cached_tokens"] == 0  # nothing sent before
    second = _chat(http, [*OPENING, {"role": "user", "content": "two"}])
    counter = _counter()
    prefix = sum(counter.message(m) for m in OPENING)
    assert prefix >= 1024
    assert second["prompt_tokens_details"]["cached_tokens"] == prefix - prefix % 128
    assert second["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens"]
    other = _chat(http, [*OPENING, {"role": "user", "content": "three"}], key="sk-b")
    assert other["prompt_tokens_details"]["cached_tokens"] == 0  # another key's cache
    recorded = http.get("/_sim/requests").json()
    assert [r["usage"] for r in recorded] == [first, second, other]


def test_a_changed_opening_misses(http: httpx.Client) -> None:
    http.delete("/_sim/requests")
    _chat(http, [*OPENING, {"role": "user", "content": "one"}])
    changed = [{"role": "system", "content": "Changed."}, *OPENING[1:]]
    usage = _chat(http, [*changed, {"role": "user", "content": "one"}])
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_responses_report_input_cached_tokens(http: httpx.Client) -> None:
    http.delete("/_sim/requests")
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in OPENING]
    usages = []
    for last in ("one", "two"):
        r = http.post(
            "/v1/responses",
            json={"model": "m", "input": [*items, {"role": "user", "content": last}]},
            headers={"Authorization": "Bearer sk-a"},
        )
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
    prefix = sum(_counter().message(m) for m in OPENING)
    assert usages[0]["input_tokens_details"]["cached_tokens"] == 0
    assert usages[1]["input_tokens_details"]["cached_tokens"] == prefix - prefix % 128
    assert [r["usage"] for r in http.get("/_sim/requests").json()] == usages
