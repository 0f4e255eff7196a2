"""``GET /v1/models`` and ``GET /v1/models/{id}``: the upstream's listing, each model in
it given the window and output limit the proxy plans with, as gateways advertise them.

A client that sizes its own context from the listing (Claude Code with gateway model
discovery reads Anthropic's ``max_input_tokens`` and ``max_tokens``; other clients read
``context_window``) otherwise assumes a window behind any proxy, and compacts too late
or too early. A field the upstream already gives is never replaced (the upstream knows
its own models); a model whose window neither the configuration nor the registry knows
gets nothing (its window would be the proxy's default, a guess). A listing that is not
a 200, not plain JSON, or larger than ``MAX_LISTING_BYTES`` goes through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.core.models import ResolvedModel

MAX_LISTING_BYTES = 4 * 1024 * 1024
# The most models of one listing given a window (each is one bounded lookup).
MAX_MODELS = 2000
_MAX_ID_CHARS = 256


def with_windows(body: bytes, resolve: Callable[[str], ResolvedModel]) -> bytes | None:
    """``body`` (a models listing, or one model) with each model's window and output limit
    added where absent; None when there is nothing to add (relay it as it came)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    data = parsed.get("data")
    models = data[:MAX_MODELS] if isinstance(data, list) else [parsed]
    added = sum(_annotate(m, resolve) for m in models)
    return orjson.dumps(parsed) if added else None


def _annotate(model: Any, resolve: Callable[[str], ResolvedModel]) -> bool:
    if not isinstance(model, dict):
        return False
    name = model.get("id")
    if not isinstance(name, str) or not name or len(name) > _MAX_ID_CHARS:
        return False
    spec = resolve(name)
    if spec.source not in ("config", "provider", "registry"):
        return False
    before = len(model)
    model.setdefault("context_window", spec.context_window)
    model.setdefault("max_input_tokens", spec.context_window)  # Anthropic's Models API
    model.setdefault("max_tokens", spec.max_output_tokens)
    return len(model) > before
