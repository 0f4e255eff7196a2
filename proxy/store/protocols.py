"""What a store does: the protocols, split by concern, and the values they pass.

A store keeps, per ``SessionKey``, one ``Snapshot``, the session's latest
``Sighting`` and a short-lived summarization lock, and learned context
windows under plain string keys. The protocols are split by concern
(``Snapshots``, ``Sightings``, ``LockStore``, ``WindowStore``); callers
take the narrowest one they need, and ``Store`` combines them. The output items
``item_reference`` inputs name are an ``ItemStore`` of their own, built beside the
store on the same backend (``store/items.py``), and so is the ``Archive`` of the originals
a session's snapshots replaced (``store/archive.py``). Writes are
compare-and-swap on the version: a snapshot with version N is written only
over version N-1 (or over nothing for N=1), so a slow writer can never
replace a newer summary. Every backend imports these from here, never from the package,
whose factories import the backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from proxy.core.snapshot import Snapshot as Snapshot  # re-exported: the value stores keep

if TYPE_CHECKING:
    from proxy.core.passages import Original
    from proxy.core.session import SessionKey
    from proxy.store.health import Health


class Snapshots(Protocol):
    """Per-session snapshots, compare-and-swap on the version."""

    async def load(self, key: SessionKey) -> Snapshot | None: ...

    async def load_many(self, keys: Sequence[SessionKey]) -> list[Snapshot | None]:
        """``load`` of each key, in order; one round trip to a shared store."""
        ...

    async def save(self, key: SessionKey, snapshot: Snapshot) -> bool:
        """Write if the stored version is ``snapshot.version - 1``; False if it lost the race."""
        ...

    async def delete(self, key: SessionKey) -> bool: ...

    async def list_sessions(self, limit: int) -> list[tuple[SessionKey, Snapshot]]:
        """Up to ``limit`` stored (key, snapshot) pairs, in no particular order."""
        ...


@dataclass(frozen=True, slots=True)
class Dropped:
    """What one archive write removed to stay within the bounds, in bytes."""

    session: int = 0  # the session's own oldest originals
    tenant: int = 0  # other sessions' of the tenant


@dataclass(frozen=True, slots=True)
class Sighting:
    """A session the proxy has served, compacted or not: its latest noted turn."""

    messages: int  # in the request
    tokens: int  # sent upstream (X-Context-Tokens)
    model: str
    seen_at: float  # epoch seconds


class Sightings(Protocol):
    """Sessions seen, so ``GET /sessions/{id}`` answers before a first compaction.
    Kept as long as snapshots (``store.ttl_s`` from the last note); ``Snapshots.delete``
    forgets a session's sighting too."""

    async def note_seen(self, key: SessionKey, sighting: Sighting) -> None: ...

    async def load_seen(self, key: SessionKey) -> Sighting | None: ...


class LockStore(Protocol):
    """Per-session summarization locks (single flight across replicas)."""

    async def acquire(self, key: SessionKey, ttl_s: float) -> str | None:
        """Take the session's summarization lock; an owner token, or None if held."""
        ...

    async def release(self, key: SessionKey, token: str) -> None: ...


class WindowStore(Protocol):
    """Context windows learned from upstream overflow errors, keyed by plain strings."""

    async def load_window(self, key: str) -> int | None:
        """A context window learned from an upstream's overflow error, if any."""
        ...

    async def save_window(self, key: str, tokens: int, ttl_s: float) -> None: ...


class ItemStore(Protocol):
    """Output items the proxy relayed on ``/v1/responses``, per tenant by item id, so an
    ``item_reference`` to one can be read when counting and summarizing (issue 24).

    Values are an item's JSON, as bytes. Bounded (``store/items.py``): an item of more
    than ``MAX_ITEM_BYTES`` or with an id of more than ``MAX_ID_CHARS`` is not kept; a
    tenant keeps at most ``ITEMS_PER_TENANT``, its least recently used dropped first;
    each is kept ``store.ttl_s`` from its last write or read."""

    async def remember_items(self, tenant: str, items: Sequence[tuple[str, bytes]]) -> None:
        """Keep each (id, JSON) of ``items`` for ``tenant``."""
        ...

    async def recall_items(self, tenant: str, ids: Sequence[str]) -> list[bytes | None]:
        """The JSON kept for each of ``ids`` (None: not kept, or no longer), in order."""
        ...


class Archive(Protocol):
    """The originals of what a session's snapshots summarized or elided, verbatim, in the
    order archived; kept and removed with the session's snapshot (``Snapshots.delete``),
    bounded per session and per tenant, oldest first (``store/archive.py``)."""

    async def archive(self, key: SessionKey, originals: Sequence[Original]) -> Dropped:
        """Append ``originals`` to ``key``'s archive; what the bounds dropped for it."""
        ...

    async def load_archive(self, key: SessionKey) -> list[Original]:
        """``key``'s archive, oldest first (empty: none, or expired)."""
        ...


class Remote(Snapshots, Sightings, LockStore, WindowStore, Protocol):
    """What a shared store does (``RedisStore``), which ``ResilientStore`` wraps.

    A write (``save``, ``note_seen``, ``acquire``, ``save_window``, ``probe``) that
    returns without ``StoreError`` was performed, except where its result says it was
    not: a ``save`` that lost the race (False), an ``acquire`` of a held lock (None)."""

    @property
    def one_server(self) -> bool:
        """Every key on one server, so a write it performed shows the whole store takes
        writes; False for a cluster, where only ``probe`` (every primary) shows that."""
        ...

    async def ping(self) -> bool: ...

    async def probe(self) -> None:
        """Small writes that expire by themselves, one on every primary of a cluster;
        ``StoreError`` if the store refuses any (``health.ProbeFailed``: which
        primaries). A PING does not tell: a read-only replica and a full Redis answer it."""
        ...

    async def aclose(self) -> None: ...


class Store(Remote, Protocol):
    """Everything a store does: what ``build_store`` returns."""

    async def health(self) -> Health:
        """What recent calls say of the store (``/readyz``), probing when they say little."""
        ...
