"""The client's history, measured once (compaction/count.py): the value every pure step
reads, planning (plan.py), views (view.py), trimming (trim.py) and rebuilding
(rebuild.py), and what of the messages it takes to build it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.types import ChatMessage

_LEADING_ROLES = ("system", "developer")
# Results belong to the assistant message that asked for them; only they are elided.
RESULT_ROLES = ("tool", "function")


@dataclass(frozen=True, slots=True)
class History:
    """The client's history, measured: what planning, validation and rebuilding read.

    ``digests[i]``, ``counts[i]`` and ``results[i]`` (``result_flags``) belong to
    ``messages[i]``; ``pinned`` leading messages are always sent verbatim; ``fixed`` is
    the tokens outside the messages (tool definitions, response format, reply priming).
    """

    messages: Sequence[ChatMessage]
    digests: Sequence[bytes]
    counts: Sequence[int]
    pinned: int
    fixed: int
    results: bytes
    seed: int = (
        0  # the digests' (digest.tenant_seed): an earlier release's anchor is checked with it
    )


def count_pinned(
    messages: Sequence[ChatMessage], pin_first_user: bool, user_prefixes: Sequence[str] = ()
) -> int:
    """How many leading messages are always sent verbatim (invariant 1).

    The leading system/developer messages, then the user messages right after them:
    the first one when ``pin_first_user``, and each one in a row with a text part
    opening with one of ``user_prefixes`` (a client's context message, as Codex's
    ``<environment_context>``). The newest message is never pinned: it is the tail's.
    """
    pinned = 0
    while pinned < len(messages) and messages[pinned]["role"] in _LEADING_ROLES:
        pinned += 1
    first, prefixes = pinned, tuple(user_prefixes)
    while pinned < len(messages) and messages[pinned]["role"] == "user":
        if not (pin_first_user and pinned == first) and not _opens_with(messages[pinned], prefixes):
            break
        pinned += 1
    return min(pinned, max(len(messages) - 1, 0))


def _opens_with(message: ChatMessage, prefixes: tuple[str, ...]) -> bool:
    """Whether a text part of ``message`` (its content, when a string) opens with one of
    ``prefixes``, leading whitespace aside."""
    content = message.get("content")
    if not prefixes or not content:
        return False
    if isinstance(content, str):
        return content.lstrip().startswith(prefixes)
    texts = (part.get("text") for part in content if isinstance(part, dict))
    return any(isinstance(t, str) and t.lstrip().startswith(prefixes) for t in texts)


def result_flags(messages: Sequence[ChatMessage]) -> bytes:
    """1 for each result message, 0 for any other: all that views and plans read of the
    messages. Planning a long history then walks one compact string, not every message
    (each a dict somewhere among the contents: a 50k-message history misses the caches).
    """
    return bytes([m["role"] in RESULT_ROLES for m in messages])
