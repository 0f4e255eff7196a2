"""The names a ``RedisStore`` files things under.

``prefix`` defaults to ``cp``; ``key`` is ``SessionKey.storage_key``,
``{tenant}:{h|d}:{session}``, which holds no credential and no client bytes; a window's
key is the string it was saved under, ``windows.window_key``. ``{name}`` stands for a
value, but the outer braces of ``{{key}}`` are literal (``cp:snap:{<tenant>:h:<id>}``):

```
one server (redis://)             a cluster (redis+cluster://)
{prefix}:snap:{key}               {prefix}:snap:{{key}}    hash   v, d (snapshot)
{prefix}:lock:{key}               {prefix}:lock:{{key}}    string owner token, PX lock ttl
{prefix}:seen:{key}               {prefix}:seen:{{key}}    string latest Sighting, PX ttl
{prefix}:arch:{key}               {prefix}:arch:{{key}}    list   the archive: redis_archive.py
{prefix}:shadow-snap:{key}        {prefix}:shadow-snap:{{key}}   shadow mode's snapshot
{prefix}:shadow-lock:{key}        {prefix}:shadow-lock:{{key}}   its summarization lock
{prefix}:win:{key}                {prefix}:win:{key}       string learned window, PX ttl
{prefix}:health:probe             {prefix}:health:probe:{n}   string "1", PX 10 s (/readyz)
```

On a cluster a session's keys carry its storage key as a hash tag (the braces), so they
share one slot: the ``DEL`` of a snapshot and its sighting is one command on one node.
Every Lua script touches one key. A window is one key read or written alone, so it needs
no tag. A cluster's probe writes one key on each primary, ``n`` (a number) chosen so that
its slot is that primary's.

One server keeps the layout it always had, untagged: an upgrade finds every snapshot
where the previous release left it and no session is summarized again, with no
migration and no second read on each load. Moving a store from one server to a cluster
starts it empty (as any new Redis does). A prefix may not hold braces
(``StoreSettings``): one there would move the tag.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.core.session import SessionKey


@dataclass(frozen=True, slots=True)
class KeyLayout:
    prefix: str = "cp"
    tagged: bool = False  # a cluster's: session keys hash-tagged

    def session(self, kind: str, key: SessionKey) -> str:
        """A session's ``snap``, ``lock``, ``seen`` or ``arch`` key; a shadow key's (``key.shadow``)
        are ``shadow-snap``..., which no scan of snapshots (``snapshots``) lists."""
        name, kind = key.storage_key, f"shadow-{kind}" if key.shadow else kind
        return f"{self.prefix}:{kind}:{{{name}}}" if self.tagged else f"{self.prefix}:{kind}:{name}"

    def window(self, key: str) -> str:
        return f"{self.prefix}:win:{key}"

    def probe(self, tag: int | None = None) -> str:
        """``/readyz``'s write (resilient.py); a cluster's, hash-tagged ``tag``."""
        name = f"{self.prefix}:health:probe"
        return name if tag is None else f"{name}:{{{tag}}}"

    def snapshots(self) -> str:
        """What every snapshot key starts with (a scan's pattern, before its ``*``)."""
        return f"{self.prefix}:snap:"

    def windows(self) -> str:
        return f"{self.prefix}:win:"

    def session_of(self, name: str) -> SessionKey | None:
        """The session a snapshot key (``session(\"snap\", …)``) was made for; None for a
        key this layout never made."""
        rest = name[len(self.snapshots()) :]
        if self.tagged:
            if not (rest.startswith("{") and rest.endswith("}")):
                return None
            rest = rest[1:-1]
        return SessionKey.from_storage_key(rest)
