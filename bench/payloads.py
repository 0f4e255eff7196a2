"""The request bodies the benchmark sends, generated deterministically (same bytes every run)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

import orjson

PayloadName = Literal["chat20", "chat20_stream", "big100k", "view100k"]
MODEL = "gpt-4o"

_VOCABULARY = (
    "the of and to in is that for it as with was on be by this are or from at an but not have "
    "which they you one all were we can there their has been if more when will would who so no "
    "request proxy token window summary context session upstream stream message latency budget "
    "compaction snapshot reply assistant user system model function value error retry config"
)
_WORDS = _VOCABULARY.split()
_SYLLABLE_TEXT = "ka lo mi ren tos vax quil dor bre nu zef sha por gly tem ix ob ur"
_SYLLABLES = _SYLLABLE_TEXT.split()


def _text(rng: random.Random, chars: int) -> str:
    """Prose-like filler that tokenizes at roughly 4 characters per token."""
    words: list[str] = []
    size = 0
    while size < chars:
        if rng.random() < 0.2:
            word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        elif rng.random() < 0.1:
            word = f"{rng.randint(0, 99999)}."
        else:
            word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _chat(messages: int, chars_per_message: int, seed: int, stream: bool) -> bytes:
    rng = random.Random(seed)
    convo = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(messages - 1):
        role = "user" if i % 2 == 0 else "assistant"
        convo.append({"role": role, "content": _text(rng, chars_per_message)})
    body: dict[str, object] = {"model": MODEL, "messages": convo, "max_tokens": 16}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def build_payload(name: PayloadName) -> bytes:
    """The JSON body for ``name``: ~8 KB over 20 messages, ~400 KB (~100k tokens), or
    ``view100k``: a body the size of the view ``big100k``'s snapshot forwards (~212 KB,
    105 messages), what the upstream exchange of a warm turn costs by itself."""
    if name == "chat20":
        return _chat(20, 400, seed=20, stream=False)
    if name == "chat20_stream":
        return _chat(20, 400, seed=20, stream=True)
    if name == "view100k":
        return _chat(105, 2000, seed=100, stream=False)
    return _chat(200, 2000, seed=100, stream=False)


def write_payloads(directory: Path) -> dict[PayloadName, Path]:
    """Write every payload to ``directory``; wrk's Lua script reads them from there."""
    paths: dict[PayloadName, Path] = {}
    for name in ("chat20", "chat20_stream", "big100k", "view100k"):
        path = directory / f"{name}.json"
        path.write_bytes(build_payload(name))
        paths[name] = path
    return paths
