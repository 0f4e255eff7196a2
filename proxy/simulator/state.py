"""What the simulator's handlers share (``Simulator``): its config, one prompt counter
per tokenizer, the recorder, the prompt caches, the model profiles, its slots, and the
responses it stored (``StoredResponses``). The handlers (app.py, messages.py,
responses.py, stream.py) read it; it reads none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from cachetools import LRUCache
from starlette.requests import Request

from proxy.core.cache_outcome import CacheOutcome
from proxy.core.encodings import load_encoders
from proxy.simulator.anthropic_cache import AnthropicCache
from proxy.simulator.config import ModelProfile, SimulatorConfig, resolve_model
from proxy.simulator.counting import PromptCounter
from proxy.simulator.errors import ErrorInfo, invalid_request, openai_error
from proxy.simulator.prompt_cache import PromptCache
from proxy.simulator.recorder import Recorder

_PROFILE_CACHE_LIMIT = 1024
# api.openai.com's words for an item it does not hold (HTTP 404, param "input", no code).
ITEM_NOT_FOUND = (
    "Item with id '{id}' not found. Items are not persisted when `store` is set to false. "
    "Try again with `store` set to true, or remove this item from your input."
)
_STORED_LIMIT = 1024
_STORED_ITEMS_LIMIT = 16 * _STORED_LIMIT


class Simulator:
    """Everything the handlers share: config, one prompt counter per tokenizer, the recorder."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        encoders = load_encoders(config.tokenizers())
        self.counters = {name: PromptCounter(enc) for name, enc in encoders.items()}
        self.recorder = Recorder(config.recording.max_requests, config.recording.max_bytes)
        self.responses = StoredResponses()  # for previous_response_id
        cache = config.prompt_cache
        self.prompt_cache = PromptCache(
            ttl_s=cache.ttl_s, min_tokens=cache.min_tokens, increment=cache.increment
        )
        self.anthropic_cache = AnthropicCache(cache.anthropic_ttl_s, cache.anthropic_long_ttl_s)
        # Bounded: clients may invent model names. Event loop only, so no lock.
        self._profiles: LRUCache[str, ModelProfile] = LRUCache(_PROFILE_CACHE_LIMIT)
        self._slots = asyncio.Semaphore(config.slots) if config.slots else None
        # The prompt each slot read last, as cache blocks (prompt_cache.chat_blocks).
        self._slot_prompts: list[list[tuple[object, int]]] = [[] for _ in range(config.slots or 0)]

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of ``config.slots`` while answering: a request beyond them waits
        for one, as on llama.cpp's server with ``-np`` slots (summaries included)."""
        if self._slots is None:
            yield
            return
        if self._slots.locked():
            self.recorder.bump("slot_waits")
        async with self._slots:
            yield

    def read_prompt_ms(self, blocks: list[tuple[object, int]], total: int) -> float:
        """Within a slot: the time its reading ``blocks`` (``total`` tokens) takes at
        ``config.prompt_tokens_per_s``, the longest prefix a slot's last prompt shares with
        it not read again (that slot then keeps this one, as llama.cpp's slots choose by
        similarity); 0 without slots or a reading speed."""
        speed = self.config.prompt_tokens_per_s
        if speed is None or not self._slot_prompts:
            return 0.0
        shared = [_shared_tokens(last, blocks) for last in self._slot_prompts]
        best = max(range(len(shared)), key=shared.__getitem__)
        self._slot_prompts[best] = blocks
        unread = max(total - shared[best], 0)
        self.recorder.bump("prompt_tokens_read", unread)
        return unread / speed * 1000

    def profile(self, model: str) -> ModelProfile:
        found = self._profiles.get(model)
        if found is None:
            found = self._profiles[model] = resolve_model(self.config, model)
        return found

    def counter(self, profile: ModelProfile) -> PromptCounter:
        return self.counters[profile.tokenizer]

    def cached(
        self, request: Request, blocks: list[tuple[object, int]], total: int, scale: float
    ) -> tuple[int, CacheOutcome | None]:
        """The cached tokens of a prompt of ``blocks`` (prompt_cache.py), ``total`` tokens
        counted at ``scale``, sent with the request's API key, and the cache's outcome."""
        if scale != 1.0:
            blocks = [(value, int(tokens * scale)) for value, tokens in blocks]
        return self.prompt_cache.lookup(request.headers.get("authorization", ""), blocks, total)


class StoredResponses:
    """Conversations of recent responses (input and output items), for chaining, and
    their output items by id, for ``item_reference``."""

    def __init__(self) -> None:
        self._items: LRUCache[str, list[dict[str, Any]]] = LRUCache(_STORED_LIMIT)
        self._outputs: LRUCache[str, dict[str, Any]] = LRUCache(_STORED_ITEMS_LIMIT)

    def get(self, response_id: str) -> list[dict[str, Any]]:
        found = self._items.get(response_id)
        if found is None:
            raise invalid_request(
                f"Previous response with id '{response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return found

    def item(self, item_id: str) -> dict[str, Any]:
        """The stored output item ``item_id``, as the response gave it."""
        found = self._outputs.get(item_id)
        if found is None:
            info = ErrorInfo(ITEM_NOT_FOUND.format(id=item_id), param="input")
            raise openai_error(404, info)
        return found

    def put(
        self, response_id: str, items: list[dict[str, Any]], output: list[dict[str, Any]]
    ) -> None:
        """Keep ``items`` (the conversation, ``output`` last) and each output item by id."""
        self._items[response_id] = items
        for item in output:
            if isinstance(item.get("id"), str):
                self._outputs[item["id"]] = item


def _shared_tokens(last: list[tuple[object, int]], blocks: list[tuple[object, int]]) -> int:
    """The tokens of the longest common prefix of two prompts' blocks, whole blocks."""
    shared = 0
    for (before, tokens), (now, _) in zip(last, blocks, strict=False):
        if before != now:
            break
        shared += tokens
    return shared
