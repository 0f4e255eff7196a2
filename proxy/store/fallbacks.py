"""The archive and the output items on Redis through a ``ResilientStore``'s outage
handling: Redis's, or this process's while the store serves from local state. What the
store decides for snapshots (its cool-down, error counts, logs and call timings) it
decides for these too, under their own operation names.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.passages import Original
from proxy.core.session import SessionKey
from proxy.store.protocols import Archive, Dropped, ItemStore, Store
from proxy.store.resilient import ResilientStore


class ResilientArchive:
    """Redis's archive, or this process's while the store serves from local state: the
    ``ResilientStore``'s outage handling (its cool-down, error counts, logs and call
    timings, under the operations ``archive`` and ``load_archive``) decides, as it does for
    output items (items.py). What a replica archived during an outage is recalled by it
    alone, until the session's next compaction archives again."""

    def __init__(self, store: ResilientStore, remote: Archive, local: Archive) -> None:
        self._store = store
        self.remote = remote
        self.local = local

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        remote, local = self.remote, self.local
        return await self._store._call(
            "archive",
            lambda: remote.archive(key, originals),
            lambda: local.archive(key, originals),
        )

    async def load_archive(self, key: SessionKey) -> list[Original]:
        remote, local = self.remote, self.local
        return await self._store._call(
            "load_archive", lambda: remote.load_archive(key), lambda: local.load_archive(key)
        )


class ResilientItems:
    """Redis's items, or this process's while the store serves from local state: the
    ``ResilientStore``'s outage handling (its cool-down, error counts, logs and call
    timings, under the operations ``remember_items`` and ``recall_items``) decides."""

    def __init__(self, store: Store, remote: ItemStore, local: ItemStore) -> None:
        assert isinstance(store, ResilientStore)
        self._store = store
        self.remote = remote
        self.local = local

    async def remember_items(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        remote, local = self.remote, self.local
        await self._store._call(
            "remember_items",
            lambda: remote.remember_items(tenant, items),
            lambda: local.remember_items(tenant, items),
        )

    async def recall_items(self, tenant: str, ids: Sequence[str]) -> list[bytes | None]:
        remote, local = self.remote, self.local
        return await self._store._call(
            "recall_items",
            lambda: remote.recall_items(tenant, ids),
            lambda: local.recall_items(tenant, ids),
        )
