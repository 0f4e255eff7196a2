"""The model registry's index (core/registry.py) and its place in the model table's
order: a models: entry, then the registry, then default_model."""

from __future__ import annotations

import pytest

from proxy.config import Settings
from proxy.core.models import ModelTable
from proxy.core.registry import Listing, Prices, Registry, build_registry
from proxy.upstream.registry import read_registry

SETTINGS = {"upstream": {"base_url": "http://127.0.0.1:1/v1"}}


@pytest.fixture(scope="module")
def shipped() -> Registry:
    return read_registry()  # ~0.1 s: once for the module


def _registry() -> Registry:
    return build_registry(
        [
            ("some-gateway", [Listing("gpt-4o", 64_000, 4096)]),
            ("openai", [Listing("gpt-4o", 128_000, 16_384, Prices(2.5, 10.0))]),
            ("host-a", [Listing("meta-llama/Llama-3.1-70B-Instruct", 131_072, 16_384)]),
            ("host-b", [Listing("llama-3.1-70b-instruct", 131_072, 16_384)]),
            ("host-c", [Listing("llama-3.1-70b-instruct", 8_192, 8_192)]),
            ("host-d", [Listing("whole-window-1", 32_768, 32_768), Listing("no-window-1", 0, 10)]),
            ("gateway", [Listing("auto", 400_000, 128_000), Listing("kilo/small", 400_000, 0)]),
        ],
        "test 1",
    )


def test_the_makers_own_listing_wins_over_a_gateways() -> None:
    entry = _registry().lookup("gpt-4o")
    assert entry is not None
    assert (entry.context_window, entry.max_output_tokens, entry.provider) == (
        128_000,
        16_384,
        "openai",
    )
    assert entry.prices == Prices(2.5, 10.0)


def test_among_hosts_the_figures_most_agree_on_win() -> None:
    entry = _registry().lookup("llama-3.1-70b-instruct")
    assert entry is not None
    assert (entry.context_window, entry.max_output_tokens) == (131_072, 16_384)


@pytest.mark.parametrize(
    "name",
    ["GPT-4o", "openai/gpt-4o", "openrouter/openai/gpt-4o", "meta-llama/llama-3.1-70b-instruct"],
)
def test_a_name_is_found_in_any_case_and_after_a_vendor_prefix(name: str) -> None:
    assert _registry().lookup(name) is not None


def test_a_listing_without_a_window_is_left_out() -> None:
    assert _registry().lookup("no-window-1") is None
    assert _registry().lookup("nobody-knows") is None


@pytest.mark.parametrize("name", ["auto", "small", "kilo/small"])
def test_a_bare_word_is_no_model_name(name: str) -> None:
    """A gateway's alias names no model: a local server may serve anything under it."""
    assert _registry().lookup(name) is None


def test_a_models_entry_then_the_registry_then_the_default() -> None:
    settings = Settings(**SETTINGS, models=[{"match": "gpt-4o", "context_window": 50_000}])
    table = ModelTable(settings, _registry())
    configured, listed, unknown = (table.resolve(n) for n in ("gpt-4o", "GPT-4O", "unknown-x"))
    assert (configured.context_window, configured.source) == (50_000, "config")
    assert (listed.context_window, listed.max_output_tokens, listed.source) == (
        128_000,
        16_384,
        "registry",
    )
    assert (unknown.context_window, unknown.source) == (32_768, "default")
    # A metric's label: a configured entry's match, else "other" (never the client's name).
    assert [table.entry_of(n) for n in ("gpt-4o", "GPT-4O", "unknown-x")] == [
        "gpt-4o",
        "other",
        "other",
    ]


def test_a_listed_output_limit_as_large_as_the_window_reserves_half_of_it() -> None:
    table = ModelTable(Settings(**SETTINGS), _registry())
    assert table.resolve("whole-window-1").max_output_tokens == 16_384


def test_each_name_is_reported_once_when_first_resolved() -> None:
    table = ModelTable(Settings(**SETTINGS), _registry())
    seen: list[tuple[str, str]] = []
    table.on_resolved = lambda m: seen.append((m.name, m.source))
    for name in ("gpt-4o", "gpt-4o", "unknown-x", "unknown-x"):
        table.resolve(name)
    assert seen == [("gpt-4o", "registry"), ("unknown-x", "default")]


@pytest.mark.parametrize(
    ("model", "window", "output"),
    [
        ("gpt-4o", 128_000, 16_384),
        ("gpt-4.1", 1_047_576, 32_768),
        ("claude-sonnet-4-5", 200_000, 64_000),
        ("claude-sonnet-4-5-20250929", 200_000, 64_000),
        ("gemini-2.5-pro", 1_048_576, 65_536),
    ],
)
def test_the_shipped_registry_knows_the_models_people_run(
    shipped: Registry, model: str, window: int, output: int
) -> None:
    entry = shipped.lookup(model)
    assert entry is not None
    assert (entry.context_window, entry.max_output_tokens) == (window, output)
