"""Where the output items ``item_reference`` inputs name are kept (``ItemStore``): the
embedded one (``MemoryItems``) and the bounds every store keeps them within. Redis's own
is ``redis_items.py``, the one that falls back to this process's while Redis is out
``fallbacks.py``, and ``build_item_store`` (the package's) picks the backend.

Every value a client or an upstream chooses is bounded: an item's JSON (at most
``MAX_ITEM_BYTES``; a bigger one is not kept and a reference to it counts as unresolved),
its id (at most ``MAX_ID_CHARS``), a tenant's items (at most ``ITEMS_PER_TENANT``, its
least recently used dropped first) and, in this process, all of them (``MEMORY_BYTES``).
An item is kept ``store.ttl_s`` from its last write or read, as snapshots are.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

# An answer of a model's whole 16k-token output is some 64 KB of JSON; encrypted
# reasoning rarely more. Bigger items are not kept (their references count unresolved).
MAX_ITEM_BYTES = 64 * 1024
# OpenAI's item ids are some 50 characters.
MAX_ID_CHARS = 128
# Some 20 long conversations' answers (177 references in one Vercel AI SDK session).
ITEMS_PER_TENANT = 4096
# The embedded store's items in all, in bytes of JSON.
MEMORY_BYTES = 256 * 1024 * 1024


def keepable(item_id: str, raw: bytes) -> bool:
    """Whether an item of this id and JSON is kept at all."""
    return 0 < len(item_id) <= MAX_ID_CHARS and len(raw) <= MAX_ITEM_BYTES


class MemoryItems:
    """Items in this process: one dict in write order (the oldest expire first), each
    tenant's ids in another, and the bytes they hold."""

    def __init__(
        self,
        ttl_s: float,
        *,
        per_tenant: int = ITEMS_PER_TENANT,
        max_bytes: int = MEMORY_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl_s
        self._per_tenant = per_tenant
        self._max_bytes = max_bytes
        self._clock = clock
        self._items: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._tenants: dict[str, OrderedDict[str, None]] = {}
        self._bytes = 0

    async def remember_items(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        now = self._clock()
        self._drop_expired(now)
        for item_id, raw in items:
            if not keepable(item_id, raw):
                continue
            self._forget((tenant, item_id))
            own = self._tenants.setdefault(tenant, OrderedDict())
            while len(own) >= self._per_tenant:
                self._forget((tenant, next(iter(own))))
            while self._items and self._bytes + len(raw) > self._max_bytes:
                self._forget(next(iter(self._items)))
            self._items[tenant, item_id] = (now + self._ttl, raw)
            self._tenants.setdefault(tenant, OrderedDict())[item_id] = None
            self._bytes += len(raw)

    async def recall_items(self, tenant: str, ids: Sequence[str]) -> list[bytes | None]:
        now = self._clock()
        out: list[bytes | None] = []
        for item_id in ids:
            key = (tenant, item_id)
            entry = self._items.get(key)
            if entry is None or entry[0] < now:
                out.append(None)
                continue
            # Refreshed on use, like snapshots: a live conversation's answers stay, and
            # a tenant past its bound loses its least recently used.
            self._items[key] = (now + self._ttl, entry[1])
            self._items.move_to_end(key)
            self._tenants[tenant].move_to_end(item_id)
            out.append(entry[1])
        return out

    def _drop_expired(self, now: float) -> None:
        while self._items:
            key = next(iter(self._items))
            if self._items[key][0] >= now:
                return
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        entry = self._items.pop(key, None)
        if entry is None:
            return
        self._bytes -= len(entry[1])
        tenant, item_id = key
        own = self._tenants[tenant]
        del own[item_id]
        if not own:
            del self._tenants[tenant]
