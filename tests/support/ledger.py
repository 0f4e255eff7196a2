"""The ledger's figures as the simulator's billing records make them, for the ledger's
e2e tests: each client request's entry from its recorded usage and cache outcome (the
simulator's own judgement), the summary calls made for it, and the history the client
sent. Computed here from those records, never read back from the proxy's answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from proxy.core.encodings import load_encoders
from proxy.simulator.counting import PromptCounter
from tests.support.chat import upstream_requests

PRICE = {"match": "sim-*", "input": 2.0, "cached_input": 0.5, "output": 8.0}  # test figures
WRITE_5M, WRITE_1H = 1.25, 2.0  # Anthropic's multiples of input, the pricing default


def simulator_count(messages: list[dict[str, Any]]) -> int:
    """The simulator's own count of a history (cl100k_base, its framing)."""
    counter = PromptCounter(load_encoders(["cl100k_base"])["cl100k_base"])
    return counter.prompt({"messages": messages}).total


def cacheable(tokens: int) -> int:
    return 0 if tokens < 1024 else tokens - tokens % 128


# What one forwarded call measures: (would_send, sent, cached), from the simulator's
# record of the call and the history the client sent for it.
Measure = Callable[[str, dict[str, Any], list[dict[str, Any]]], tuple[int, int, int]]


def chat_measure(
    sim: str, call: dict[str, Any], history: list[dict[str, Any]]
) -> tuple[int, int, int]:
    usage = call["usage"]
    sent, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
    return simulator_count(history), sent, cached


def messages_measure(
    sim: str, call: dict[str, Any], history: list[dict[str, Any]]
) -> tuple[int, int, int]:
    """On the Messages API: the prompt is ``input_tokens`` plus what the cache read and
    wrote, ``cached`` what it read, and the history as the client sent it is counted by
    the simulator's own ``count_tokens``."""
    usage = call["usage"]
    cached = usage["cache_read_input_tokens"]
    sent = usage["input_tokens"] + cached + usage["cache_creation_input_tokens"]
    asked = {**call["body"], "messages": history}
    del asked["max_tokens"]
    would = httpx.post(f"{sim}/v1/messages/count_tokens", json=asked).json()["input_tokens"]
    return would, sent, cached


def _summarized(usage: dict[str, Any]) -> tuple[int, int, int]:
    """A summary call's input, output and, of the input, what the cache served."""
    if "prompt_tokens" in usage:
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        return usage["prompt_tokens"], usage["completion_tokens"], cached
    given = usage["input_tokens"] + usage["cache_read_input_tokens"]
    given += usage["cache_creation_input_tokens"]
    return given, usage["output_tokens"], usage["cache_read_input_tokens"]


def expected(
    sim: str, histories: list[list[dict[str, Any]]], measure: Measure = chat_measure
) -> list[dict[str, Any]]:
    """Each client request's entry and cache outcome, from the simulator's records: its
    usage and outcome, the summary calls made for it (recorded just before it), and the
    history the client sent. The client's histories only grow, so a prefix change is
    the proxy's."""
    entries: list[dict[str, Any]] = []
    summarized = [0, 0, 0]
    previous_would = 0
    chats = iter(histories)
    for call in upstream_requests(sim):
        usage = call["usage"]
        if call["headers"].get("x-compaction-purpose") == "summarize":
            summarized = [a + b for a, b in zip(summarized, _summarized(usage), strict=True)]
            continue
        history = next(chats)
        would, sent, cached = measure(sim, call, history)
        as_sent = call["body"]["messages"] == history
        tiers = usage.get("cache_creation") or {}
        writes = (
            tiers.get("ephemeral_5m_input_tokens", 0),
            tiers.get("ephemeral_1h_input_tokens", 0),
        )
        outcome = call["cache"]
        if as_sent:
            assert would == sent
            would_cached, would_written = cached, sum(writes)
        else:
            cold = outcome in ("cold_start", "ttl_expiry")
            would_cached = 0 if cold else cacheable(min(previous_would, would))
            would_written = would - would_cached if sum(writes) else 0
        figures = (would, sent, cached, would_cached, writes, would_written)
        entries.append(entry(figures, summarized, outcome))
        summarized = [0, 0, 0]
        previous_would = would
    assert next(chats, None) is None
    return entries


def entry(
    figures: tuple[int, int, int, int, tuple[int, int], int],
    summarized: list[int],
    outcome: str,
) -> dict[str, Any]:
    """One request's ledger fields on its line, as the simulator's records make them."""
    would, sent, cached, would_cached, (short, long), would_written = figures
    out: dict[str, Any] = {
        "would_send": would,
        "sent": sent,
        "cached": cached,
        "would_cached": would_cached,
        "summarizer_input": summarized[0],
        "summarizer_output": summarized[1],
        "estimated": False,
        "written_5m": short,
        "written_1h": long,
        "would_written": would_written,
        "summarizer_cached": summarized[2],
        "net": would - sent - summarized[0] - summarized[1],
        "cache": outcome,
    }
    if outcome == "prefix_change":
        out["cache_cause"] = "proxy"
    return out


def money(e: dict[str, Any]) -> tuple[float, float]:
    """What the request would have cost and what it cost, at ``PRICE``, as billed."""
    p_in, p_cached, p_out = PRICE["input"], PRICE["cached_input"], PRICE["output"]
    wrote = e["written_5m"] + e["written_1h"]
    paid = (e["sent"] - e["cached"] - wrote) * p_in + e["cached"] * p_cached
    paid += (e["written_5m"] * WRITE_5M + e["written_1h"] * WRITE_1H) * p_in
    summarizer_uncached = e["summarizer_input"] - e["summarizer_cached"]
    paid += summarizer_uncached * p_in + e["summarizer_cached"] * p_cached
    paid += e["summarizer_output"] * p_out
    tier = WRITE_5M if e["written_5m"] or not e["written_1h"] else WRITE_1H
    would = (e["would_send"] - e["would_cached"] - e["would_written"]) * p_in
    would += e["would_cached"] * p_cached + e["would_written"] * tier * p_in
    return would / 1_000_000, paid / 1_000_000


def ledger_fields(line: dict[str, Any]) -> dict[str, Any]:
    return {k.removeprefix("ledger_"): v for k, v in line.items() if k.startswith("ledger_")}
