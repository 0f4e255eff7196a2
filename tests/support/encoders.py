"""cl100k_base as the proxy loads it, and the tiktoken encoding underneath, for the token tests."""

from __future__ import annotations

from typing import Any

from proxy.core.encodings import TiktokenEncoder, load_encoder

ENCODER = load_encoder("cl100k_base")


def _tiktoken_encoding() -> Any:
    assert isinstance(ENCODER, TiktokenEncoder)
    return ENCODER._encoding
