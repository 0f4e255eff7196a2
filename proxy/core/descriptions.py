"""What a provider says about its own models, read from the bodies real servers answer:
a model's window and output limit by its name. Pure: bytes in, figures out, never an
error (a body that is not what it should be describes nothing).

The fields, as each project's source names them:

* ``GET /v1/models`` entries (``data[]``, keyed by ``id``): vLLM's ``max_model_len``
  (``ModelCard`` in ``vllm/entrypoints/openai/protocol.py``); OpenRouter's
  ``context_length`` and ``top_provider.context_length`` /
  ``top_provider.max_completion_tokens`` (its ``TopProviderInfo``); Anthropic's Models
  API ``max_input_tokens`` / ``max_tokens`` (``ModelInfo`` in ``anthropic-sdk-python``),
  which this proxy's own listing also adds (``routes/models_list.py``); ``context_window``
  (Groq, and this proxy's listing). llama.cpp's entries carry only ``meta.n_ctx_train``,
  the length the model was trained for, not the one it serves: never read as a window.
* llama.cpp's ``GET /props``: ``default_generation_settings.n_ctx``, the context of one
  slot (``get_props`` in ``tools/server/server-context.cpp``: the per-slot value, the
  one it rejects prompts against), for the one model it serves; ``total_slots``, the
  requests it answers at once (``-np``; one: a turn queues behind any other request).
* LiteLLM's ``GET /model/info`` (``data[]``, keyed by ``model_name``): ``model_info``'s
  ``max_input_tokens`` and ``max_output_tokens`` (else ``max_tokens``), as its model
  table carries them (docs.litellm.ai, "Model Management").

Every figure is bounded: an entry's name at most ``MAX_NAME_CHARS``, at most
``MAX_MODELS`` entries read, and a number outside ``SMALLEST``..``LARGEST`` (or not an
integer) is no figure at all: a hostile or broken upstream can neither make the proxy
keep much nor plan against a window of a billion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

MAX_MODELS = 2000
MAX_NAME_CHARS = 256
SMALLEST = 256  # no model serves a window smaller; a figure below is a misreading
LARGEST = 100_000_000  # ten times the largest window any model claims
MAX_SLOTS = 65_536  # llama.cpp's -np: far more than any one server runs


@dataclass(frozen=True, slots=True)
class Described:
    """A model's window (tokens, input and output together), output limit and the
    requests its server answers at once (None: not said), as its provider states them."""

    window: int
    output: int | None = None
    slots: int | None = None


@dataclass(frozen=True, slots=True)
class Listing:
    """What a models listing said: the models it gave a window, how many it listed in
    all, and whether it is llama.cpp's (whose window is in ``/props``)."""

    described: dict[str, Described]
    listed: int = 0
    llamacpp: bool = False


def read_listing(body: bytes) -> Listing:
    """``GET /v1/models``'s answer read: each entry whose fields state a window."""
    entries = _entries(body)
    described: dict[str, Described] = {}
    llamacpp = False
    for entry in entries:
        name = _name(entry.get("id"))
        if name is None:
            continue
        # llama.cpp's own (owned_by "llamacpp", and its meta block): /props has the window.
        llamacpp = llamacpp or entry.get("owned_by") == "llamacpp" or "meta" in entry
        top = entry.get("top_provider")
        top = top if isinstance(top, dict) else {}
        windows = [
            _count(entry.get(key))
            for key in ("max_model_len", "context_length", "context_window", "max_input_tokens")
        ]
        windows.append(_count(top.get("context_length")))
        # The smallest stated: a gateway's top provider may serve less than the model allows.
        window = min((w for w in windows if w is not None), default=None)
        if window is not None:
            output = _count(top.get("max_completion_tokens")) or _count(entry.get("max_tokens"))
            described[name] = Described(window, _output(output, window))
    return Listing(described, len(entries), llamacpp)


def read_props(body: bytes) -> Described | None:
    """llama.cpp's ``GET /props`` read: the window of a slot and how many slots, or None."""
    parsed = _object(body)
    settings = parsed.get("default_generation_settings") if parsed else None
    if not parsed or not isinstance(settings, dict):
        return None
    window = _count(settings.get("n_ctx"))
    # Not said, or not a count: as a server that says nothing of its slots.
    slots = _count(parsed.get("total_slots"), 1, MAX_SLOTS)
    return None if window is None else Described(window, slots=slots)


def read_model_info(body: bytes) -> dict[str, Described]:
    """LiteLLM's ``GET /model/info`` read: each deployment's window by its model name
    (the name clients send); two deployments of one name: the smaller window."""
    described: dict[str, Described] = {}
    for entry in _entries(body):
        name = _name(entry.get("model_name"))
        info = entry.get("model_info")
        if name is None or not isinstance(info, dict):
            continue
        window = _count(info.get("max_input_tokens"))
        if window is None:
            continue
        output = _count(info.get("max_output_tokens")) or _count(info.get("max_tokens"))
        told = Described(window, _output(output, window))
        seen = described.get(name)
        described[name] = told if seen is None or told.window < seen.window else seen
    return described


def _object(body: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _entries(body: bytes) -> list[dict[str, Any]]:
    parsed = _object(body)
    data = parsed.get("data") if parsed else None
    if not isinstance(data, list):
        return []
    return [entry for entry in data[:MAX_MODELS] if isinstance(entry, dict)]


def _name(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS:
        return value
    return None


def _count(value: object, smallest: int = SMALLEST, largest: int = LARGEST) -> int | None:
    """A count as a provider states one (tokens, unless told): an integer in range (a JSON
    float that is whole, too: some servers write 8192.0), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and smallest <= value <= largest:
        return value
    return None


def _output(output: int | None, window: int) -> int | None:
    """An output limit that fits the window (some list the window itself as the limit)."""
    return output if output is not None and output <= window else None
