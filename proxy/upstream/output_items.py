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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.store.items import MAX_ITEM_BYTES, keepable

if TYPE_CHECKING:
    from proxy.store import ItemStore

_DONE = b"response.output_item.done"
# An event holds one item and its envelope; a JSON answer all of them.
_EVENT_LIMIT = MAX_ITEM_BYTES + 4096
_BODY_LIMIT = 4 * 1024 * 1024


class OutputItems:
    """One answer's output items for ``tenant``: ``watch`` sees each chunk relayed, and
    ``keep`` (a follow-up, once the answer is out) remembers what it found."""

    def __init__(self, store: ItemStore, tenant: str) -> None:
        self._store = store
        self._tenant = tenant
        self._pending = bytearray()
        self._mode: str | None = None  # "json" or "sse", from the first byte
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
            else:
                self._mode = "skip"
            return
        if self._mode == "sse":
            self._events(chunk)

    async def keep(self) -> None:
        """Remember the items found (a JSON answer's are read now, once it is whole)."""
        if self._mode == "json" and self._pending:
            try:
                body = orjson.loads(self._pending)
            except orjson.JSONDecodeError:
                body = None
            output = body.get("output") if isinstance(body, dict) else None
            for item in output if isinstance(output, list) else ():
                self._add(item)
            self._pending.clear()
        if self.found:
            await self._store.remember_items(self._tenant, self.found)
            self.found = []

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
