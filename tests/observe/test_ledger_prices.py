"""The ledger's money without a ``pricing`` rule: the model registry's list prices, and
the totals say so; a ``pricing`` rule overrides them."""

from __future__ import annotations

from time import perf_counter

import pytest
from prometheus_client import CollectorRegistry

from proxy.core.outcome import Outcome
from proxy.core.registry import Listing, Prices, build_registry
from proxy.observe.ledger import Ledger
from proxy.observe.record import Record
from proxy.pricing import PriceRule

REGISTRY = build_registry(
    [("openai", [Listing("gpt-4o", 128_000, 16_384, Prices(2.5, 10.0, 1.25))])], "test 1"
)


def _finish(ledger: Ledger, model: str) -> float | None:
    """One request of ``model``: 10,000 tokens of history sent as 4,000 (the upstream's
    count), 1,000 of them cached; no summary."""
    outcome = Outcome("snapshot", [], 1, 4000, 128_000)
    rec = Record("r", perf_counter(), model=model, tenant="t", session_header="s")
    rec.upstream_status, rec.outcome, rec.tokens_before = 200, outcome, 10_000
    rec.usage, rec.summarized = (4000, 1000), (0, 0, False)
    finished = ledger.finish(rec)
    assert finished is not None
    return finished[1]


def test_a_model_without_a_pricing_rule_is_priced_at_the_registrys_list_prices() -> None:
    ledger = Ledger(CollectorRegistry(), [], REGISTRY)
    money = _finish(ledger, "gpt-4o")
    # Would have sent 10,000 at $2.50/M; sent 3,000 at $2.50 and 1,000 cached at $1.25.
    assert money == pytest.approx((10_000 * 2.5 - 3000 * 2.5 - 1000 * 1.25) / 1e6)
    totals = ledger.sessions[next(iter(ledger.sessions))].as_dict()
    assert totals["prices"] == "registry"
    assert totals["money_saved_usd"] == pytest.approx(money)


def test_a_pricing_rule_overrides_the_registry() -> None:
    rule = PriceRule(match="gpt-4o*", input=1.0, output=2.0)
    ledger = Ledger(CollectorRegistry(), [rule], REGISTRY)
    assert _finish(ledger, "gpt-4o") == pytest.approx((10_000 - 4000) * 1.0 / 1e6)
    assert ledger.tenants["t"].as_dict()["prices"] == "pricing"


def test_a_model_neither_prices_has_no_money() -> None:
    ledger = Ledger(CollectorRegistry(), [], REGISTRY)
    assert _finish(ledger, "sim-4k") is None
    assert "prices" not in ledger.tenants["t"].as_dict()


@pytest.mark.parametrize(("listed_write", "write_5m"), [(4.0, 4.0), (None, 3.0 * 1.25)])
def test_list_prices_bill_cache_writes_by_tier(listed_write: float | None, write_5m: float) -> None:
    """A registry-priced model's cache writes: the 5-minute tier at the listed cache-write
    price (unlisted: 1.25 times input), the hour's at 2 times input (no listing has one)."""
    listing = Listing("claude-x", 200_000, 8192, Prices(3.0, 15.0, 0.3, listed_write))
    ledger = Ledger(CollectorRegistry(), [], build_registry([("anthropic", [listing])], "t"))
    outcome = Outcome("snapshot", [], 1, 4000, 200_000)
    rec = Record("r", perf_counter(), model="claude-x", tenant="t", session_header="s")
    rec.upstream_status, rec.outcome, rec.tokens_before = 200, outcome, 10_000
    rec.usage, rec.summarized, rec.cache_writes = (4000, 1000), (0, 0, False), (2000, 1000)
    finished = ledger.finish(rec)
    assert finished is not None
    # A session's first request (cold_start): the history as sent would have written all
    # 10,000 at 5 minutes; what went read 1,000 and wrote 2,000 + 1,000, nothing plain.
    would = 10_000 * write_5m
    paid = 1000 * 0.3 + 2000 * write_5m + 1000 * 3.0 * 2
    assert finished[1] == pytest.approx((would - paid) / 1e6)
    assert ledger.tenants["t"].as_dict()["prices"] == "registry"
