"""Step 5's arithmetic (compaction/count.py runs it): the tokens the upstream will count.

Follows what providers count: per-message overhead, role, text content
(strings and content-part arrays), names, tool calls with their arguments,
tool results, tool/function definitions, ``response_format`` schemas, and a
flat per-image estimate. Per-message counts are cached by the message's
digest (see ``digest.py``), so a new turn costs only its new messages.
``pending_bytes`` tells the caller how much tokenizing is left to do, so a
large job can run in a worker thread: the caches are safe to share with one.

``upper_bound`` is the cheap check that lets a request far below the
threshold skip exact counting: byte-level BPE never yields more tokens than
bytes, so body length plus fixed per-message and per-image (or audio) part costs
bounds the count from above.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from itertools import compress
from operator import not_
from typing import Any, cast

import orjson
from cachetools import LRUCache
from xxhash import xxh3_128_digest

from proxy.core.encodings import Encoder
from proxy.types import UNSEEN_ITEM, ChatMessage, ChatRequest

# OpenAI's cookbook accounting for chat models: 3 tokens wrap every message,
# 1 more for a name, and 3 prime the assistant's reply.
PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
PER_TOOL_CALL = 7
# A high-detail 1024x1024 image costs 765 tokens on gpt-4o; low detail 85.
IMAGE_TOKENS = 765
IMAGE_TOKENS_LOW = 85
AUDIO_TOKENS = 400
# A Responses ``item_reference`` to an output the proxy does not hold (routes/items.py)
# is a content part of type UNSEEN_ITEM, priced at this many tokens: conservatively, a long
# answer's worth (a chat answer is mostly a few hundred tokens, a tool call far less),
# so compaction triggers early rather than late when the proxy cannot see its text.
UNSEEN_ITEM_TOKENS = 512
# The per-message cache is a plain dict, not a cachetools cache: its lookup runs
# for every message of every counted request, and LRUCache's Python-level
# lookup (plus the lock its reordering needs) made a hit loop several times
# slower (bench/README.md). It evicts first-in-first-out instead, which
# suits conversations that only grow at the end.
_CACHE_LIMIT = 200_000  # keyed by 16-byte digests: bounded in bytes as in entries
_FIXED_CACHE_LIMIT = 1_000
_DEFINITION_KEYS = ("tools", "functions", "response_format")
_TOOL_KEYS = ("tools", "functions")
# Open models' chat templates (Qwen2.5's, Hermes' and their kin) put the tool definitions
# in the system message: one line per tool, its JSON with Python's spacing (jinja's
# ``tojson``: ", " and ": "), inside fixed instructions. Counting the compact JSON alone
# read 0.76-0.88 of llama.cpp's count, and the first tool request has no calibration
# (calibrate.py) to correct it: for models outside OpenAI's families (which count
# definitions their own, shorter, way) they are counted as such a template renders them.
TEMPLATE_TOOLS_HEAD = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TEMPLATE_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class TokenCounter:
    """Counts with one encoder; owns the per-message cache for that encoder."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self._cache: dict[bytes, int] = {}
        # A few lookups per request at most, so LRU's cost does not matter here.
        self._fixed_cache: LRUCache[bytes, int] = LRUCache(_FIXED_CACHE_LIMIT)
        # Message-cache lookups need no lock (one dict read is atomic); its inserts
        # and evictions do: two threads evicting at once would both pick the same
        # oldest key. Every use of the LRU cache does, since a hit reorders it.
        self._lock = threading.Lock()

    @property
    def exact(self) -> bool:
        return self.encoder.exact

    def messages(self, messages: Sequence[ChatMessage], digests: Sequence[bytes]) -> list[int]:
        if len(messages) != len(digests):
            raise ValueError(f"{len(digests)} digests for {len(messages)} messages")
        cache = self._cache
        # One lookup per message in C; a warm history has them all (bench/README.md,
        # "The warm session"), and only what the cache lacks is counted below.
        found: list[int | None] = list(map(cache.get, digests))
        if None not in found:
            return cast(list[int], found)
        out: list[int] = []
        for message, digest, n in zip(messages, digests, found, strict=True):
            if n is None:
                n = self.message(message)
                with self._lock:
                    if len(cache) >= _CACHE_LIMIT:
                        del cache[next(iter(cache))]  # first in, first out
                    cache[digest] = n
            out.append(n)
        return out

    def pending_bytes(
        self,
        request: ChatRequest,
        digests: Sequence[bytes],
        sizes: Sequence[int],
        seed: int = 0,
        templated: bool = False,
    ) -> int:
        """Bytes that ``messages`` and ``fixed`` would tokenize now: what the cache lacks.

        ``sizes`` are the messages' encoded lengths, ``seed`` their digests' seed
        (``digest.digests_and_sizes``).
        """
        if len(digests) != len(sizes):
            raise ValueError(f"{len(sizes)} sizes for {len(digests)} digests")
        # The sizes of the messages the cache lacks, looked up in C (a warm history: none).
        pending = sum(compress(sizes, map(not_, map(self._cache.__contains__, digests))))
        for digest, raw, _ in _definitions(request, seed, templated):
            with self._lock:
                missing = digest not in self._fixed_cache
            if missing:
                pending += len(raw)
        return pending

    def message(self, message: ChatMessage) -> int:
        count = self.encoder.count
        n = PER_MESSAGE + count(message.get("role", ""))
        n += _content_tokens(message.get("content"), count)
        name = message.get("name")
        if isinstance(name, str):
            n += PER_NAME + count(name)
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            n += (
                PER_TOOL_CALL + count(str(fn.get("name", ""))) + count(str(fn.get("arguments", "")))
            )
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str):
            n += count(call_id)
        return n

    def fixed(self, request: ChatRequest, seed: int = 0, templated: bool = False) -> int:
        """Tokens outside the messages: definitions, schemas, reply priming.

        ``templated``: tool definitions counted as an open model's chat template renders
        them (``TEMPLATE_TOOLS_HEAD``), not as their JSON. Agent loops send the same
        tool definitions every turn: counts are cached by the definitions' digests
        (under ``seed``, as the messages'), so only new ones are tokenized.
        """
        n = REPLY_PRIMING
        for digest, raw, tools in _definitions(request, seed, templated):
            with self._lock:
                count = self._fixed_cache.get(digest)
            if count is None:
                text = raw.decode()
                if templated and tools is not None:
                    text = _as_template_renders(tools, text)
                count = self.encoder.count(text)
                with self._lock:
                    self._fixed_cache[digest] = count
            n += count
        return n

    def text(self, text: str) -> int:
        return self.encoder.count(text)


def _definitions(
    request: ChatRequest, seed: int, templated: bool
) -> Iterator[tuple[bytes, bytes, Any]]:
    """(digest, JSON, the block if it is tool definitions) of each definition block the
    request carries; the digest tells a templated count from a plain one."""
    for key in _DEFINITION_KEYS:
        value: Any = request.get(key)
        if value:
            raw = orjson.dumps(value)
            digest = xxh3_128_digest(raw, seed)
            tools = value if key in _TOOL_KEYS else None
            yield (digest + b"t" if templated else digest), raw, tools


def _as_template_renders(definitions: Any, raw: str) -> str:
    """Tool ``definitions`` (``raw``: their JSON) as a Hermes-style template renders them."""
    if not isinstance(definitions, list):
        return raw  # not a list of tools: the upstream will say so; count what was sent
    lines = "".join("\n" + json.dumps(d, ensure_ascii=False) for d in definitions)
    return TEMPLATE_TOOLS_HEAD + lines + TEMPLATE_TOOLS_TAIL


def _content_tokens(content: Any, count: Any) -> int:
    if isinstance(content, str):
        return int(count(content))
    if not isinstance(content, list):
        return 0
    n = 0
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" or kind == "refusal":
            n += int(count(str(part.get(kind, ""))))
        elif kind == "image_url":
            image = part.get("image_url")
            low = isinstance(image, dict) and image.get("detail") == "low"
            n += IMAGE_TOKENS_LOW if low else IMAGE_TOKENS
        elif kind == "input_audio":
            n += AUDIO_TOKENS
        elif kind == UNSEEN_ITEM:
            n += UNSEEN_ITEM_TOKENS
        else:
            # Unknown part types (files, future kinds): count their JSON so we err high.
            n += int(count(orjson.dumps(part).decode()))
    return n


def upper_bound(body: bytes, messages: Sequence[Any]) -> int:
    """A count no request with this body (and these parsed ``messages``) can exceed."""
    return _text_bound(body, len(messages)) + _media_parts(messages) * (IMAGE_TOKENS + AUDIO_TOKENS)


def bounded_by(body: bytes, messages: Sequence[Any], limit: int) -> bool:
    """``upper_bound(body, messages) <= limit``, without looking at a body too big anyway."""
    text = _text_bound(body, len(messages))
    return text <= limit and text + _media_parts(messages) * (IMAGE_TOKENS + AUDIO_TOKENS) <= limit


def _text_bound(body: bytes, n_messages: int) -> int:
    return len(body) + n_messages * (PER_MESSAGE + PER_NAME + PER_TOOL_CALL) + REPLY_PRIMING


def _media_parts(messages: Sequence[Any]) -> int:
    """The content parts counted at a flat price (images, audio): the only tokens that
    are not bytes of the body. Read from the parsed messages: two byte scans of the
    body for their names cost more than the whole parse check (bench/README.md)."""
    n = 0
    for message in messages:
        content = message.get("content")
        if type(content) is not str and isinstance(content, list):  # text: most of them
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "image_url" or kind == "input_audio" or kind == UNSEEN_ITEM:
                    n += 1
    return n


def output_reserve(request: ChatRequest, model_max: int) -> int:
    """Tokens the reply may take: what the request asks for, else the model's maximum.

    Capped at the model's maximum: asking for more cannot make the reply longer,
    and the upstream's output-budget error for it is recovered separately.
    """
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        # bool is an int in Python; `max_tokens: true` is not a token count.
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, model_max)
    return model_max
