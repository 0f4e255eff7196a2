"""``/v1/embeddings`` and legacy ``/v1/completions`` (``/v1/models``: listing.py).

Just enough of each for the proxy's pass-through of non-chat paths to be
tested end to end with the official SDK; answers are deterministic.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

import orjson

from proxy.simulator.completion import CREATED, usage
from proxy.simulator.counting import PromptCounter
from proxy.simulator.errors import invalid_request, missing_parameter
from proxy.simulator.replies import filler_words, fit_words

DEFAULT_DIMENSIONS = 16
MAX_DIMENSIONS = 4096
LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _vector(item: object, dimensions: int) -> list[float]:
    seed = hashlib.blake2b(orjson.dumps(item), digest_size=8).digest()
    state = int.from_bytes(seed, "little")
    values = []
    for _ in range(dimensions):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        values.append((state >> 11) / float(1 << 53) * 2.0 - 1.0)
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    unit = [v / norm for v in values]
    # Round through float32 so "float" and "base64" answers carry the same numbers.
    return list(struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *unit)))


def _input_tokens(item: object, counter: PromptCounter) -> int:
    if isinstance(item, str):
        return counter.text(item)
    return len(item) if isinstance(item, list) else 0


def _inputs(body: dict[str, Any]) -> list[object]:
    if "input" not in body:
        raise missing_parameter("input")
    raw = body["input"]
    # A list of ints is one pre-tokenized input; any other list holds several inputs.
    if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)):
        return [raw]
    if isinstance(raw, list) and raw:
        return list(raw)
    raise invalid_request("'$.input' is invalid. Please check the API reference.", param="input")


def embeddings_body(body: dict[str, Any], counter: PromptCounter) -> dict[str, Any]:
    model = str(body.get("model", ""))
    dimensions = body.get("dimensions") or DEFAULT_DIMENSIONS
    if not isinstance(dimensions, int) or not 1 <= dimensions <= MAX_DIMENSIONS:
        raise invalid_request(
            f"Invalid 'dimensions': expected an integer from 1 to {MAX_DIMENSIONS}.",
            param="dimensions",
        )
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for index, item in enumerate(_inputs(body)):
        vector = _vector(item, dimensions)
        tokens += _input_tokens(item, counter)
        embedding: object = (
            base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
            if as_base64
            else vector
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def legacy_completion_body(
    body: dict[str, Any], counter: PromptCounter, reply_tokens: int
) -> dict[str, Any]:
    """A ``text_completion``: filler seeded by each prompt, cut to ``max_tokens``."""
    if body.get("stream"):
        raise invalid_request("The simulator does not stream /v1/completions.", param="stream")
    prompts = _inputs({"input": body.get("prompt", "")})
    budget = body.get("max_tokens")
    if budget is None:
        budget = LEGACY_DEFAULT_MAX_TOKENS
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise invalid_request(
            "Invalid 'max_tokens': expected a non-negative integer.", param="max_tokens"
        )
    choices = []
    prompt_tokens = completion_tokens = 0
    for index, prompt in enumerate(prompts):
        seed = hashlib.blake2b(orjson.dumps(prompt), digest_size=8).digest()
        text, cut = fit_words("", filler_words(seed, reply_tokens), budget, counter.encoder)
        prompt_tokens += _input_tokens(prompt, counter)
        completion_tokens += counter.text(text)
        choices.append(
            {
                "text": text,
                "index": index,
                "logprobs": None,
                "finish_reason": "length" if cut else "stop",
            }
        )
    digest = hashlib.blake2b(orjson.dumps(prompts), digest_size=12).hexdigest()
    return {
        "id": f"cmpl-{digest}",
        "object": "text_completion",
        "created": CREATED,
        "model": str(body.get("model", "")),
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }
