"""The request bodies one worker process holds at once (``server.max_inflight_body_bytes``).

A body the proxy reads whole (a chat or responses body, a passthrough body of a
declared length up to ``max_body_bytes``) takes its bytes from the budget before they
are read: its declared Content-Length up front, else each chunk as it arrives. A body
that would take the total over the budget gets ``Overloaded`` (503, Retry-After) and is
never read (uvicorn discards what the client still sends once the answer is out).
What a request took returns when it ends, answered, failed or abandoned by its
client: ``endpoint`` calls ``release`` in a ``finally``, since the body and what was
parsed from it live until the response is sent, streams included.

Bodies the proxy streams through without holding them (passthrough uploads larger
than ``max_body_bytes`` or of unknown length) take nothing: flow control holds at
most a chunk of each, and ``server.max_client_connections`` bounds how many.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from proxy.config import ServerSettings
from proxy.errors import Overloaded

# The scope key under which a request's hold is kept (absent: it took nothing).
_HELD = "proxy.body_budget"


class _Hold:
    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0


class BodyBudget:
    """Bytes of request bodies held by this process's requests in flight."""

    __slots__ = ("limit", "used")

    def __init__(self, server: ServerSettings) -> None:
        configured = server.max_inflight_body_bytes
        # Never below one allowed body, or a lone largest body could never be served.
        self.limit = max(configured or 4 * server.max_body_bytes, server.max_body_bytes)
        self.used = 0

    def take(self, scope: MutableMapping[str, Any], size: int) -> None:
        """Count ``size`` more bytes against the request of ``scope``, or raise
        ``Overloaded`` (counting nothing) if they would take the total over the limit."""
        if not size:  # an empty body holds nothing: no hold to keep
            return
        if self.used + size > self.limit:
            raise Overloaded(
                "The proxy is holding as many request bodies as it may; retry shortly."
            )
        hold = scope.get(_HELD)
        if hold is None:
            hold = scope[_HELD] = _Hold(self)
        hold.size += size
        self.used += size


def release(scope: MutableMapping[str, Any]) -> None:
    """Return what the request of ``scope`` took; called once, as it ends."""
    hold: _Hold | None = scope.pop(_HELD, None)
    if hold is not None:
        hold.budget.used -= hold.size
