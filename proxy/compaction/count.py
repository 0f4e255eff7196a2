"""Step 5: count the client's history once, into the ``History`` every later step reads.

A turn usually costs only its new messages: ``TokenCounter`` caches counts per
message digest. Small or cached work runs inline; a large history or much new
text runs in a worker thread, so one huge request cannot freeze the proxy for
everyone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.config import CompactionSettings
from proxy.core.digest import digests_and_sizes
from proxy.core.history import History, count_pinned, result_flags
from proxy.core.outcome import Turn
from proxy.core.session import SessionKey, session_key
from proxy.core.tokens import TokenCounter
from proxy.types import ChatMessage, ChatRequest

# CPU on the event loop stalls every request, /healthz included; a hop to a worker
# thread costs more than a usual turn's counting (a few dozen cached messages). Up to
# this much uncounted text stays inline, and the hop is a small share of anything
# larger (the figures: bench/README.md, "Figures behind the code").
INLINE_COUNT_BYTES = 32 * 1024
# Digesting this much stays well under a millisecond (bench/README.md), and tokenizing
# what a cache lacks adds to it.
_INLINE_DIGEST_BYTES = 1024 * 1024
_INLINE_MESSAGES = 2_000
# Bodies above this are parsed in a worker thread, so the loop keeps serving others.
PARSE_INLINE_BYTES = 1024 * 1024


async def count_history(
    counter: TokenCounter, turn: Turn, pins: CompactionSettings, seed: int
) -> History:
    """Digests (under ``seed``: ``digest.tenant_seed``), per-message token counts and
    the tokens outside the messages (tool definitions as a chat template renders them
    when the model's ``templated_tools``: ``TokenCounter.fixed``) of ``turn``'s chat;
    its pinned messages by ``pins.pin_first_user`` and ``pins.pin_user_prefixes``."""
    chat, body, templated = turn.chat, turn.body, turn.model.templated_tools
    messages = chat["messages"]
    if len(body) > _INLINE_DIGEST_BYTES or len(messages) > _INLINE_MESSAGES:
        digests, counts, fixed, results = await asyncio.to_thread(
            _digest_and_count, counter, chat, seed, templated
        )
    else:
        digests, sizes = digests_and_sizes(messages, seed)
        results = result_flags(messages)
        # The body bounds whatever is left to tokenize: small ones need no cache check.
        if len(body) > INLINE_COUNT_BYTES and (
            counter.pending_bytes(chat, digests, sizes, seed, templated) > INLINE_COUNT_BYTES
        ):
            counts, fixed = await asyncio.to_thread(_count, counter, chat, digests, seed, templated)
        else:
            counts, fixed = _count(counter, chat, digests, seed, templated)
    pinned = count_pinned(messages, pins.pin_first_user, pins.pin_user_prefixes)
    return History(messages, digests, counts, pinned, fixed, results, seed)


async def session_of(turn: Turn, messages: Sequence[ChatMessage]) -> SessionKey:
    """Step 3: the session ``turn`` names, else the one its history derives: a hash of the
    opening messages, which can be most of a big body, so worked out off the loop."""
    if turn.session_header is None and len(turn.body) > PARSE_INLINE_BYTES:
        return await asyncio.to_thread(session_key, turn.tenant, None, messages)
    return session_key(turn.tenant, turn.session_header, messages)


async def count_text(counter: TokenCounter, text: str) -> int:
    if len(text) > INLINE_COUNT_BYTES:  # characters: at least as many bytes
        return await asyncio.to_thread(counter.text, text)
    return counter.text(text)


def _digest_and_count(
    counter: TokenCounter, chat: ChatRequest, seed: int, templated: bool
) -> tuple[list[bytes], list[int], int, bytes]:
    digests, _ = digests_and_sizes(chat["messages"], seed)
    counted = _count(counter, chat, digests, seed, templated)
    return (digests, *counted, result_flags(chat["messages"]))


def _count(
    counter: TokenCounter, chat: ChatRequest, digests: list[bytes], seed: int, templated: bool
) -> tuple[list[int], int]:
    return counter.messages(chat["messages"], digests), counter.fixed(chat, seed, templated)
