"""The output items of a relayed ``/v1/responses`` answer, read off its bytes on their way
to the client and remembered once the answer is out (issue 24).

A client with ``store: true`` (the Vercel AI SDK's default Responses provider) sends an
earlier answer back as ``{"type": "item_reference", "id": ...}``: the proxy can count
and summarize it only if it kept the item it relayed under that id. ``OutputItems``
watches the bytes the relay forwards unchanged: a JSON answer's ``output``, or a
stream's ``response.output_item.done`` events, each the item whole. Only those events
are parsed (a byte search finds them); the chunks themselves are never re-serialized.
Only the item is, to keep it. What it holds is bounded: an event or a JSON body past
its limit is skipped, and the store bounds the rest (store/items.py). A body in a
content encoding (gzip) is not read: its references then count as unseen.

A client may name an answer's items the moment the answer ends (the Vercel AI SDK does,
in a tool loop), before a write begun after it would have landed. So an item is written
as soon as it is read whole, before the bytes after it go out, and the items a request
names are read once this process's writes for its tenant have landed (``ItemWrites``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from proxy.store.items import MAX_ITEM_BYTES, keepable

if TYPE_CHECKING:
    from proxy.store import ItemStore

log = logging.getLogger(__name__)

_DONE = b"response.output_item.done"
# An event holds one item and its envelope; a JSON answer all of them.
_EVENT_LIMIT = MAX_ITEM_BYTES + 4096
_BODY_LIMIT = 4 * 1024 * 1024
# A JSON answer ending in "}" is read early at most this often (an upstream could end
# every chunk so); past it the items are read whole once the answer is out.
_EARLY_TRIES = 3
# How long a read waits for writes in flight: a store write, not an answer.
WRITES_WAIT_S = 2.0


class ItemWrites:
    """An ``ItemStore`` that knows this process's writes in flight, per tenant: ``start``
    begins one without waiting for it, and a read waits (at most ``WRITES_WAIT_S``) for its
    tenant's, so it finds what an answer just sent. Only tenants with a write in flight are
    held, each by its own tasks: ms, not another answer's time."""

    def __init__(self, store: ItemStore) -> None:
        self.store = store
        self._writing: dict[str, set[asyncio.Task[None]]] = {}

    def start(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        task = asyncio.get_running_loop().create_task(self._write(tenant, items))
        self._writing.setdefault(tenant, set()).add(task)  # held: no task lost to the GC
        task.add_done_callback(partial(self._landed, tenant))

    async def _write(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        try:
            await self.store.remember_items(tenant, items)
        except Exception as exc:  # a task nobody awaits: said here, not lost
            log.warning("output items not kept: %s", type(exc).__name__)

    def _landed(self, tenant: str, task: asyncio.Task[None]) -> None:
        writing = self._writing.get(tenant)
        if writing is not None:
            writing.discard(task)
            if not writing:
                del self._writing[tenant]

    async def remember_items(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        await self.store.remember_items(tenant, items)

    async def recall_items(self, tenant: str, ids: Sequence[str]) -> list[bytes | None]:
        writing = self._writing.get(tenant)
        if writing:
            await asyncio.wait(set(writing), timeout=WRITES_WAIT_S)
        return await self.store.recall_items(tenant, ids)


class OutputItems:
    """One answer's output items for ``tenant``: ``watch`` sees each chunk relayed, and
    ``keep`` (a follow-up, once the answer is out) remembers what it found."""

    def __init__(self, store: ItemStore, tenant: str) -> None:
        self._store = store
        # Written as each is read whole when the store knows its writes (the app's does).
        self._early = store if isinstance(store, ItemWrites) else None
        self._tenant = tenant
        self._pending = bytearray()
        self._mode: str | None = None  # "json" or "sse", from the first byte; "skip", "done"
        self._tries = 0  # early reads of a JSON answer: bounded, each parses all so far
        self._skipping = False  # inside an event past _EVENT_LIMIT: to its end
        self.found: list[tuple[str, bytes]] = []

    def watch(self, chunk: bytes) -> None:
        if self._mode is None:
            head = chunk.lstrip()
            if not head:
                return
            self._mode = "json" if head[:1] == b"{" else "sse"
        if self._mode == "json":
            if len(self._pending) + len(chunk) <= _BODY_LIMIT:
                self._pending += chunk
                ends = chunk.rstrip().endswith(b"}")
                if self._early is not None and ends and self._tries < _EARLY_TRIES:
                    self._tries += 1
                    self._answer()  # whole, most likely: read before its last bytes go
            else:
                self._mode = "skip"
        elif self._mode == "sse":
            self._events(chunk)
        if self._early is not None and self.found:
            self._early.start(self._tenant, self.found)
            self.found = []

    async def keep(self) -> None:
        """Remember the items found (a JSON answer's are read now, once it is whole)."""
        if self._mode == "json" and self._pending:
            self._answer()
            self._pending.clear()
        if self.found:
            await self._store.remember_items(self._tenant, self.found)
            self.found = []

    def _answer(self) -> None:
        """A JSON answer's items, once its bytes so far parse (then nothing more is read)."""
        try:
            body = orjson.loads(self._pending)
        except orjson.JSONDecodeError:
            return
        output = body.get("output") if isinstance(body, dict) else None
        for item in output if isinstance(output, list) else ():
            self._add(item)
        self._pending.clear()
        self._mode = "done"

    def _events(self, chunk: bytes) -> None:
        pending = self._pending
        # Lines may end in CRLF, split across chunks; no JSON holds a raw CR.
        pending += chunk.replace(b"\r", b"") if b"\r" in chunk else chunk
        while True:
            end = pending.find(b"\n\n")
            if end < 0:
                if len(pending) > _EVENT_LIMIT:  # an event too big to keep: drop to its end
                    self._skipping = True
                    del pending[: len(pending) - 1]
                return
            event = bytes(pending[:end])
            del pending[: end + 2]
            if self._skipping:
                self._skipping = False
            elif _DONE in event:
                self._event(event)

    def _event(self, event: bytes) -> None:
        data = b"\n".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(parsed, dict) and parsed.get("type") == "response.output_item.done":
            self._add(parsed.get("item"))

    def _add(self, item: Any) -> None:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            return
        raw = orjson.dumps(item)
        if keepable(item["id"], raw):
            self.found.append((item["id"], raw))
