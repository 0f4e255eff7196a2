"""Message digests and the hash chain over a history prefix.

Every message gets a digest of its canonical encoding (orjson, sorted keys),
computed once per request. Digests key the token-count cache, derive
header-less session ids, and chain into the prefix hash a snapshot stores to
prove a history still starts with exactly the messages it summarized
(DESIGN invariant 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

import orjson

from proxy.errors import InvalidRequest
from proxy.types import ChatMessage

_DIGEST_SIZE = 16


def message_digests(messages: Sequence[ChatMessage]) -> list[bytes]:
    return digests_and_sizes(messages)[0]


def digests_and_sizes(messages: Sequence[ChatMessage]) -> tuple[list[bytes], list[int]]:
    """Each message's digest and the length of its canonical encoding in bytes.

    The sizes come free with the encoding and bound the work of counting a
    message, which decides whether counting may run on the event loop.
    """
    dumps = orjson.dumps
    sort = orjson.OPT_SORT_KEYS
    digests: list[bytes] = []
    sizes: list[int] = []
    try:
        for m in messages:
            raw = dumps(m, option=sort)
            digests.append(blake2b(raw, digest_size=_DIGEST_SIZE).digest())
            sizes.append(len(raw))
    except TypeError as exc:
        # orjson reads deeper nesting (1024) than it writes (254).
        raise InvalidRequest(
            "A message is nested too deeply to be processed.", param="messages"
        ) from exc
    return digests, sizes


def prefix_hash(digests: Sequence[bytes], length: int) -> str:
    """Hash of the first ``length`` messages, order-sensitive."""
    h = blake2b(digest_size=_DIGEST_SIZE)
    h.update(length.to_bytes(4, "big"))
    for d in digests[:length]:
        h.update(d)
    return h.hexdigest()
