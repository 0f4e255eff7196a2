"""Reading what real servers say of their models: each server's own fields, and every
figure bounded (a hostile or broken upstream describes nothing it should not)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.descriptions import (
    LARGEST,
    MAX_MODELS,
    MAX_NAME_CHARS,
    Described,
    read_listing,
    read_model_info,
    read_props,
)
from proxy.core.models import ResolvedModel, described


def _listing(*entries: dict[str, Any]) -> bytes:
    return orjson.dumps({"object": "list", "data": list(entries)})


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        # vLLM's ModelCard
        ({"id": "m", "owned_by": "vllm", "max_model_len": 8192}, Described(8192)),
        # OpenRouter: the top provider's window when smaller, and its output limit
        (
            {
                "id": "m",
                "context_length": 131_072,
                "top_provider": {"context_length": 65_536, "max_completion_tokens": 8192},
            },
            Described(65_536, 8192),
        ),
        ({"id": "m", "context_length": 200_000}, Described(200_000)),
        # Anthropic's Models API (and this proxy's own listing)
        (
            {"id": "m", "max_input_tokens": 200_000, "max_tokens": 64_000},
            Described(200_000, 64_000),
        ),
        ({"id": "m", "context_window": 131_072}, Described(131_072)),  # Groq
        ({"id": "m", "max_model_len": 8192.0}, Described(8192)),  # a whole float
        # An output limit the size of the window (or larger) is no output limit.
        ({"id": "m", "context_length": 4096, "max_tokens": 9000}, Described(4096)),
    ],
)
def test_a_listing_entry_gives_its_window_by_each_servers_own_field(
    entry: dict[str, Any], expected: Described
) -> None:
    assert read_listing(_listing(entry)).described == {"m": expected}


@pytest.mark.parametrize(
    "window",
    [LARGEST + 1, 10**12, 100, 0, -8192, True, "8192", 8192.5, None, [8192], {"n": 1}],
)
def test_an_absurd_or_misspelled_window_is_no_window(window: object) -> None:
    assert read_listing(_listing({"id": "m", "max_model_len": window})).described == {}


def test_llamacpps_trained_length_is_not_its_window() -> None:
    body = _listing({"id": "q.gguf", "owned_by": "llamacpp", "meta": {"n_ctx_train": 32768}})
    listing = read_listing(body)
    assert listing.described == {}
    assert listing.llamacpp
    assert listing.listed == 1


@pytest.mark.parametrize(
    "body",
    [b"", b"{not json", b"[]", b'{"data": {}}', b'{"data": [1, "x", null]}', b"null"],
)
def test_a_body_that_is_no_listing_describes_nothing(body: bytes) -> None:
    listing = read_listing(body)
    assert listing.described == {}
    assert listing.listed == 0


def test_names_and_entries_are_bounded() -> None:
    long = "x" * (MAX_NAME_CHARS + 1)
    entries = [{"id": f"m{i}", "max_model_len": 4096} for i in range(MAX_MODELS + 50)]
    listing = read_listing(_listing({"id": long, "max_model_len": 4096}, *entries))
    assert long not in listing.described
    assert len(listing.described) == MAX_MODELS - 1  # the first MAX_MODELS entries only


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"default_generation_settings": {"n_ctx": 16384}, "total_slots": 4},
            Described(16384, slots=4),
        ),
        (
            {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1},
            Described(4096, None, 1),
        ),
        ({"default_generation_settings": {"n_ctx": 4096}}, Described(4096)),  # not said
        # Not a count, or beyond any server's: as not said (the window still stands).
        ({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 0}, Described(4096)),
        ({"default_generation_settings": {"n_ctx": 4096}, "total_slots": True}, Described(4096)),
        ({"default_generation_settings": {"n_ctx": 4096}, "total_slots": "1"}, Described(4096)),
        ({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 10**9}, Described(4096)),
        ({"default_generation_settings": {"n_ctx": 10**11}}, None),
        ({"n_ctx": 16384}, None),  # not where llama.cpp says it
        ({"default_generation_settings": []}, None),
    ],
)
def test_llamacpps_props_give_the_window_of_a_slot_and_how_many_slots(
    body: dict[str, Any], expected: Described | None
) -> None:
    assert read_props(orjson.dumps(body)) == expected


def test_litellms_model_info_gives_each_model_names_smallest_window() -> None:
    body = {
        "data": [
            {
                "model_name": "team-gpt",
                "model_info": {"max_input_tokens": 128_000, "max_output_tokens": 16_384},
            },
            {
                "model_name": "team-gpt",
                "model_info": {"max_input_tokens": 64_000, "max_tokens": 4096},
            },
            {"model_name": "no-figures", "model_info": {"mode": "chat"}},
            {"model_name": "no-info"},
        ]
    }
    assert read_model_info(orjson.dumps(body)) == {"team-gpt": Described(64_000, 4096)}


def test_a_described_model_reserves_at_most_half_its_window() -> None:
    base = ResolvedModel("m", 32_768, 4096, "cl100k_base", "default", source="default")
    small = described(base, Described(6000))
    assert (small.context_window, small.max_output_tokens, small.source) == (6000, 3000, "provider")
    assert described(base, Described(200_000, 8192)).max_output_tokens == 8192
    assert described(base, Described(200_000)).max_output_tokens == 4096  # the base's, unsaid


def test_a_server_of_one_slot_makes_its_model_single_slot_unless_the_default_says() -> None:
    base = ResolvedModel("m", 32_768, 4096, "cl100k_base", "default", source="default")
    assert not base.single_slot
    assert described(base, Described(4096, slots=1)).single_slot
    assert not described(base, Described(4096, slots=4)).single_slot
    assert not described(base, Described(4096)).single_slot
    # default_model.slots, when set, is the operator's word: over the server's.
    declared = ResolvedModel("m", 32_768, 4096, "cl100k_base", "default", slots=2)
    assert not described(declared, Described(4096, slots=1)).single_slot
