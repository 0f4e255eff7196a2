"""The ledger's arithmetic (core/ledger.py), figure by figure."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.ledger import (
    Counted,
    Entry,
    cacheable,
    entry_for,
    find_cached_tokens,
    learn_ratio,
    summarizer_cached,
    summarizer_usage,
    with_summaries,
)
from proxy.core.prices import Price, price_for
from proxy.pricing import PriceRule
from tests.support.twins import money_saved


def test_a_history_sent_as_it_came_is_the_upstreams_count() -> None:
    entry = entry_for(Counted(1000, 1000, True, (1100, 256)), previous_would_send=5000)
    assert entry == Entry(1100, 1100, 256, 256)
    assert entry.net == 0


def test_a_compacted_view_saves_the_calibrated_history_less_what_was_sent() -> None:
    counted = Counted(10_000, 3_000, False, (3_300, 1_024), ratio=1.1)
    entry = entry_for(counted, previous_would_send=9_000)
    assert entry.would_send == 11_000
    assert entry.sent == 3_300
    assert entry.cached == 1_024
    assert entry.would_cached == 9_000 - 9_000 % 128  # the previous history, cacheable
    summed = with_summaries(entry, (5_000, 400, False))
    assert summed.net == 11_000 - 3_300 - 5_000 - 400


def test_without_usage_the_entry_is_estimated() -> None:
    entry = entry_for(Counted(None, 500, True, None, ratio=1.2), previous_would_send=0)
    assert entry == Entry(600, 600, 0, 0, estimated=True)
    assert with_summaries(Entry(), (1, 2, True)).estimated


def test_openais_caching_rule() -> None:
    assert cacheable(1023) == 0
    assert cacheable(1024) == 1024
    assert cacheable(1151) == 1024
    assert cacheable(1152) == 1152


def test_money_prices_cached_input_and_the_summaries() -> None:
    entry = Entry(10_000, 3_000, 1_000, 8_000, 2_000, 500)
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    would = 2_000 * 2.0 + 8_000 * 0.5
    paid = 2_000 * 2.0 + 1_000 * 0.5 + 2_000 * 2.0 + 500 * 8.0
    assert money_saved(entry, price, None) == pytest.approx((would - paid) / 1e6)
    cheap = Price(input=0.1, cached_input=0.1, output=0.4)
    paid_cheap = 2_000 * 2.0 + 1_000 * 0.5 + 2_000 * 0.1 + 500 * 0.4
    assert money_saved(entry, price, cheap) == pytest.approx((would - paid_cheap) / 1e6)


def test_a_summary_s_cached_input_is_priced_at_the_cached_price() -> None:
    """A summary asked as the turn's own request (summary_prompt: cached) reads most of
    its input from the cache: the ledger keeps that part and prices it so."""
    entry = with_summaries(Entry(10_000, 3_000), (5_000, 400, False), cached=4_608)
    assert entry.summarizer_cached == 4_608
    assert entry.net == 10_000 - 3_000 - 5_000 - 400  # tokens: the cache changes no count
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    paid = 3_000 * 2.0 + (5_000 - 4_608) * 2.0 + 4_608 * 0.5 + 400 * 8.0
    assert money_saved(entry, price, None) == pytest.approx((10_000 * 2.0 - paid) / 1e6)
    assert summarizer_cached(b'{"usage":{"prompt_tokens_details":{"cached_tokens":4608}}}') == 4608
    assert summarizer_cached(b'{"usage":{"cache_read_input_tokens":77}}') == 77
    assert summarizer_cached(b'{"usage":{"prompt_tokens":5}}') == 0


def test_the_first_matching_rule_prices_a_model() -> None:
    rule = PriceRule
    table = [
        rule(match="gpt-4o-mini*", input=0.1, cached_input=None, output=0.4),
        rule(match="gpt-4o*", input=2.0, cached_input=1.0, output=8.0),
    ]
    assert price_for(table, "gpt-4o-mini-2024") == Price(0.1, 0.1, 0.4)
    assert price_for(table, "gpt-4o") == Price(2.0, 1.0, 8.0)
    assert price_for(table, "other") is None


def test_usage_is_read_from_either_api() -> None:
    chat = orjson.dumps(
        {"usage": {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {}}}
    )
    assert summarizer_usage(chat, b"x" * 400) == (50, 7, False)
    usage = {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 12}, "output_tokens": 9}
    responses = orjson.dumps({"usage": usage})
    assert summarizer_usage(responses, b"") == (40, 9, False)
    assert find_cached_tokens(responses) == 12
    assert find_cached_tokens(b'{"usage":{"prompt_tokens":5}}') is None
    assert summarizer_usage(b'{"choices":[]}' + b" " * 86, b"x" * 400) == (100, 25, True)


def test_messages_usage_counts_the_cache_in_the_prompt() -> None:
    """Anthropic counts the prompt in three parts: the input is their sum, the cached
    part what the cache read (as the route's calibration counts it)."""
    usage = {
        "input_tokens": 30,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 1500,
        "cache_creation": {"ephemeral_5m_input_tokens": 200},
        "output_tokens": 9,
    }
    message = orjson.dumps({"type": "message", "content": [], "usage": usage})
    assert find_cached_tokens(message) == 1500
    assert summarizer_usage(message, b"") == (1730, 9, False)
    start = orjson.dumps({"type": "message_start", "message": {"usage": usage}})
    assert find_cached_tokens(start) == 1500
    assert find_cached_tokens(b'{"usage":{"input_tokens":5,"output_tokens":1}}') is None


def test_the_ratio_is_learned_from_long_histories_only() -> None:
    assert learn_ratio(None, 100, 150) is None
    assert learn_ratio(None, 1000, 1100) == pytest.approx(1.1)
    assert learn_ratio(1.0, 1000, 2000) == pytest.approx(1.2)
