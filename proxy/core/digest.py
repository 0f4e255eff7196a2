"""Message digests and the hash chain over a history prefix.

Every message gets a digest of its canonical encoding (orjson, sorted keys) in
its API-neutral form (``neutral``: one turn digests alike on every API's view),
computed once per request. Digests key the token-count cache and chain into the
prefix hash a snapshot stores to prove a history still starts with exactly the
messages it summarized (DESIGN invariant 2).

The digest is XXH3-128: a warm 100k-token history is hashed whole on every
turn, and XXH3 does that many times faster than BLAKE2b did (bench/README.md).
It is not a cryptographic hash, so it is seeded with the caller's tenant
(``tenant_seed``): whatever one credential crafts to collide lands only among its
own digests. There, a collision could only pass one of its own histories for
another it already knows, which it could simply have sent. The chain over the
digests stays BLAKE2b: it is stored, and costs 16 bytes a message.

Snapshots of format 1 (``store/codec.py``) were anchored on BLAKE2b digests;
their ``anchor_hash`` carries ``LEGACY_ANCHOR`` and ``anchor_matches`` checks
them the old way, so sessions survive an upgrade without a second summary; so are
format 2 anchors made before digests read the neutral form (over each view as sent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from hashlib import blake2b
from typing import Any, cast

import orjson
from cachetools import LRUCache
from xxhash import xxh3_128_digest

from proxy.errors import InvalidRequest
from proxy.types import ChatMessage

_DIGEST_SIZE = 16
# Marks an anchor hash chained over BLAKE2b message digests (snapshot format 1).
LEGACY_ANCHOR = "b2:"


@lru_cache(maxsize=4096)  # a tenant is a fixed-size hash (or "anonymous"): bounded in bytes
def tenant_seed(tenant: str) -> int:
    """The XXH3 seed for ``tenant``'s digests: stable across processes and replicas."""
    return int.from_bytes(blake2b(tenant.encode(), digest_size=8).digest(), "big")


def message_digests(messages: Sequence[ChatMessage], seed: int = 0) -> list[bytes]:
    return digests_and_sizes(messages, seed)[0]


def digests_and_sizes(
    messages: Sequence[ChatMessage], seed: int = 0
) -> tuple[list[bytes], list[int]]:
    """Each message's digest (under ``seed``) and the length of its canonical encoding.

    The sizes come free with the encoding and bound the work of counting a
    message, which decides whether counting may run on the event loop.
    """
    dumps = orjson.dumps
    sort = orjson.OPT_SORT_KEYS
    digests: list[bytes] = []
    sizes: list[int] = []
    try:
        for m in messages:
            # Every message of every history is digested each turn, so the commonest
            # shape, a role and a non-empty text content and nothing else, is told inline
            # as its own neutral form; any other goes through ``_digestible``. Each
            # encoding is hashed while it is fresh in the cache (bench/README.md, "The
            # warm session").
            if len(m) == 2 and type(c := m.get("content")) is str and c and "role" in m:
                raw = dumps(m, option=sort)
            else:
                raw = dumps(_digestible(m), option=sort)
            digests.append(xxh3_128_digest(raw, seed))
            sizes.append(len(raw))
    except TypeError as exc:
        # orjson reads deeper nesting (1024) than it writes (254).
        raise InvalidRequest(
            "A message is nested too deeply to be processed.", param="messages"
        ) from exc
    return digests, sizes


def _digestible(m: ChatMessage) -> Mapping[str, Any]:
    """What a digest encodes of ``m``: ``m`` itself when it is its own neutral form
    (text content, every key lowercase: no view key; no calls; a result without a
    name), else ``neutral(m)``."""
    content = m.get("content")
    plain = type(content) is str and content != "" and min(m) >= "a"
    plain = plain and "tool_calls" not in m and ("name" not in m or m["role"] != "tool")
    return m if plain else neutral(m)


def neutral(message: ChatMessage) -> Mapping[str, Any]:
    """What a digest reads of ``message``: one turn reads the same in every API's chat
    view, so a snapshot made on one API applies on another (README "One snapshot
    across APIs"). A view's own keys (``_``-prefixed: the client's Messages message or
    Responses items it stands for) are left out, as they differ by API for the same
    turn; a content of one text part reads as its text (chat sends a string, the other
    APIs text blocks or parts); a tool result's ``name`` (a view's hint for the elision
    placeholder) is left out. What identifies a turn in a view stays: its text, calls,
    results (arguments as compact JSON, a turn of calls only without content), and every
    other part as the client's JSON (thinking, reasoning, images by
    their source), so a snapshot still applies only to exactly the turns it covers."""
    content = message.get("content")
    single = isinstance(content, list) and len(content) == 1
    out = {k: v for k, v in message.items() if k[:1] != "_"}
    if single:
        part = cast(list[Any], content)[0]
        if isinstance(part, dict) and len(part) == 2 and part.get("type") == "text":
            text = part.get("text")
            out["content"] = text if isinstance(text, str) else content
    elif not content:  # a turn of calls only: null on chat, no block on the others
        out.pop("content", None)
    if out.get("role") == "tool":
        out.pop("name", None)
    calls = out.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_call(call) for call in calls]
    return out


def _call(call: object) -> object:
    """A tool call with its arguments as compact JSON, keys sorted: chat has the model's
    own string, Messages an object (the view writes it compact, in its order)."""
    if not isinstance(call, dict) or not isinstance(function := call.get("function"), dict):
        return call
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    canonical = _canonical(arguments)
    if canonical is None or canonical == arguments:
        return call
    return {**call, "function": {**function, "arguments": canonical}}


def _canonical(arguments: str) -> str | None:
    """``arguments`` as compact JSON, keys sorted; None if not JSON (a custom tool's
    free text) or nested past what orjson writes."""
    try:
        return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONDecodeError, TypeError):
        return None


def legacy_digests(messages: Sequence[ChatMessage]) -> list[bytes]:
    """BLAKE2b digests, as releases before snapshot format 2 computed them: for
    anchors stored then, and for derived session ids, which must not move."""
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
    return [blake2b(dumps(m, option=sort), digest_size=_DIGEST_SIZE).digest() for m in messages]


def prefix_hash(digests: Sequence[bytes], length: int) -> str:
    """Hash of the first ``length`` messages, order-sensitive."""
    h = blake2b(digest_size=_DIGEST_SIZE)
    h.update(length.to_bytes(4, "big"))
    for d in digests[:length]:
        h.update(d)
    return h.hexdigest()


def anchor_matches(
    anchor_hash: str,
    messages: Sequence[ChatMessage],
    digests: Sequence[bytes],
    length: int,
    seed: int = 0,
) -> bool:
    """Whether ``messages[:length]`` (with ``digests``, under ``seed``) are the ones
    ``anchor_hash`` was stored for. An anchor an earlier release stored is checked the
    way it was made: format 1 over BLAKE2b digests, format 2 before digests read the
    neutral view (``neutral``) over each message as sent. That costs one pass over them
    (bench/README.md), once per history and process: the verdict is kept under the
    prefix's own hash, as a turn checks its snapshot more than once (under the lock,
    while waiting on a summary) and each of its session's slots. The session's next
    summary re-anchors it."""
    ours = prefix_hash(digests, length)
    if ours == anchor_hash:
        return True
    verdict = _legacy_verdicts.get((ours, anchor_hash))
    if verdict is None:
        if anchor_hash.startswith(LEGACY_ANCHOR):
            earlier = legacy_digests(messages[:length])
            verdict = prefix_hash(earlier, length) == anchor_hash[len(LEGACY_ANCHOR) :]
        else:
            as_sent = _as_sent_digests(messages[:length], seed)
            verdict = prefix_hash(as_sent, length) == anchor_hash
        _legacy_verdicts[ours, anchor_hash] = verdict
    return verdict


def _as_sent_digests(messages: Sequence[ChatMessage], seed: int) -> list[bytes]:
    """XXH3 digests of each message's view as it is, view keys included, as snapshot
    format 2 anchored on before digests read the neutral view."""
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
    try:
        return [xxh3_128_digest(dumps(m, option=sort), seed) for m in messages]
    except TypeError:  # nested past what orjson writes: no anchor was made of it
        return []


# (prefix hash under XXH3 digests, an earlier release's anchor) -> whether they name the
# same prefix. Both are fixed-size hashes the proxy made: bounded in bytes as in entries.
_legacy_verdicts: LRUCache[tuple[str, str], bool] = LRUCache(maxsize=4096)
