"""Where snapshots live: the protocols (protocols.py, re-exported here) and the factories
that pick a backend: ``build_store``, and beside it, on the same backend, ``build_archive``
and ``build_item_store``. The ``Snapshot`` value is ``core/snapshot.py``'s.

Only this module imports the backends; they import the protocols from protocols.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.config import Settings
from proxy.store.protocols import Archive as Archive
from proxy.store.protocols import Dropped as Dropped
from proxy.store.protocols import ItemStore as ItemStore
from proxy.store.protocols import LockStore as LockStore
from proxy.store.protocols import Remote as Remote
from proxy.store.protocols import Sighting as Sighting
from proxy.store.protocols import Sightings as Sightings
from proxy.store.protocols import Snapshot as Snapshot
from proxy.store.protocols import Snapshots as Snapshots
from proxy.store.protocols import Store as Store
from proxy.store.protocols import WindowStore as WindowStore

if TYPE_CHECKING:
    from proxy.observe.metrics import Metrics


async def refuse_cluster_node(url: str) -> None:
    """``ConfigError`` if a one-server ``url`` names a node of a Redis Cluster: start-up's
    check (``connect.refuse_cluster_node``; redis-py is not imported for ``memory://``)."""
    if not url.startswith("memory://"):
        from proxy.store import connect

        await connect.refuse_cluster_node(url)


def build_store(settings: Settings, metrics: Metrics) -> Store:
    """``memory://`` in-process; ``redis://``, ``rediss://``, ``unix://`` and
    ``redis[s]+cluster://`` (connect.py), ``redis[s]+sentinel://`` (sentinel.py) shared
    and resilient."""
    from proxy.store.memory import MemoryStore

    url = settings.store.url
    local = MemoryStore(
        ttl_s=settings.store.ttl_s,
        max_sessions=settings.store.max_sessions,
        max_per_tenant=settings.store.max_sessions_per_tenant,
    )
    if url.startswith("memory://"):
        return local
    from proxy.store.redis import RedisOptions, RedisStore
    from proxy.store.resilient import ResilientStore

    remote = RedisStore(
        url,
        settings.store.ttl_s,
        RedisOptions(
            prefix=settings.store.prefix,
            timeout_s=settings.store.timeout_s,
            max_connections=settings.store.max_connections,
            pool_wait_s=settings.store.pool_wait_s,
            encryption_keys=[k.get_secret_value() for k in settings.store.encryption_keys],
            require_encryption=settings.store.require_encryption,
        ),
        metrics=metrics,
    )
    return ResilientStore(remote, local, metrics)


def build_archive(store: Store) -> Archive:
    """The archive on ``store``'s backend: Redis (through its outage handling) when
    ``store`` is a Redis one (``build_store``), else this process's (``MemoryStore``)."""
    from proxy.store.fallbacks import ResilientArchive
    from proxy.store.memory import MemoryStore
    from proxy.store.redis import RedisStore
    from proxy.store.resilient import ResilientStore

    if isinstance(store, ResilientStore):
        if isinstance(store.remote, RedisStore):
            return ResilientArchive(store, store.remote.archive, store.local)
        return store.local  # a remote with no archive of its own (tests' fakes)
    if isinstance(store, MemoryStore):
        return store
    raise TypeError(f"no archive for a store of type {type(store).__name__}")


def build_item_store(settings: Settings, store: Store) -> ItemStore:
    """Items on ``store``'s backend: Redis (through its outage handling) when ``store``
    is a Redis one (``build_store``), else this process."""
    from proxy.store.items import MemoryItems
    from proxy.store.resilient import ResilientStore

    local = MemoryItems(settings.store.ttl_s)
    if not isinstance(store, ResilientStore):
        return local
    from proxy.store.fallbacks import ResilientItems
    from proxy.store.redis import RedisStore
    from proxy.store.redis_items import RedisItems

    if not isinstance(store.remote, RedisStore):
        return local
    keys = [k.get_secret_value() for k in settings.store.encryption_keys]
    remote = RedisItems(store.remote.client, settings.store.prefix, settings.store.ttl_s, keys)
    return ResilientItems(store, remote, local)
