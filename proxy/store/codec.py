"""How ``RedisStore`` turns a snapshot into bytes and back.

A stored snapshot is orjson with a format version (``fv``). With
``store.encryption_keys`` the JSON is encrypted (Fernet: AES-128-CBC with
HMAC-SHA256, from the ``cryptography`` package) before it leaves the process;
summaries carry user data. Snapshots written before encryption was turned on
are still read, unless ``store.require_encryption`` says no plaintext: then one
reads as unreadable (counted, and replaced like any other). Decoding checks
every field's type, so a value this release cannot use raises ``Unreadable``
rather than reaching the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import orjson

from proxy.core.digest import LEGACY_ANCHOR
from proxy.core.passages import Original
from proxy.core.snapshot import Snapshot
from proxy.errors import ConfigError, StoreError
from proxy.store.protocols import Sighting

# 2: anchors chain XXH3 message digests. Format 1 (BLAKE2b digests) is still read: its
# anchor hash is marked so it is checked the old way (digest.py), and kept until the
# session's next summary. A release that knows only format 1 leaves format 2 alone.
# 3: a snapshot remembers where the messages around its anchor sat (``seen``, moves.py);
# a release that knows format 2 at most leaves it alone rather than replace it.
FORMAT_VERSION = 3
_READABLE_FORMATS = frozenset({1, 2, FORMAT_VERSION})
# What each Snapshot field may hold once decoded (bool is an int to Python, never to us).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    f.name: {"int": (int,), "str": (str,), "float": (int, float)}.get(str(f.type), (object,))
    for f in fields(Snapshot)
}


class Unreadable(Exception):
    """Stored bytes that are no snapshot this release can use; ``args[0]`` says why."""


class NewerFormat(Exception):
    """A snapshot written by a newer release: not ours to use, not ours to delete."""


class SnapshotCipher:
    """Fernet encryption for snapshot payloads; the first key encrypts, all decrypt."""

    def __init__(self, keys: Sequence[str], *, read_plaintext: bool = True) -> None:
        self.read_plaintext = read_plaintext  # snapshots stored before encryption
        try:
            from cryptography.fernet import Fernet, InvalidToken, MultiFernet
        except ImportError as exc:
            raise ConfigError(
                "store.encryption_keys needs the encryption extra: "
                "pip install 'compaction-proxy[encryption]'"
            ) from exc
        try:
            self._fernet = MultiFernet([Fernet(k.encode()) for k in keys])
        except ValueError as exc:
            raise ConfigError(
                "store.encryption_keys: each key must be a Fernet key (Fernet.generate_key())"
            ) from exc
        self._invalid = InvalidToken

    def encrypt(self, data: bytes) -> bytes:
        return self._fernet.encrypt(data)

    def decrypt(self, token: bytes) -> bytes:
        try:
            return self._fernet.decrypt(token)
        except self._invalid as exc:  # wrong key, or tampered with
            raise StoreError("redis snapshot cannot be decrypted (wrong key?)") from exc


def encode_snapshot(snapshot: Snapshot, cipher: SnapshotCipher | None) -> bytes:
    data = {f.name: getattr(snapshot, f.name) for f in fields(Snapshot)}
    data["fv"] = FORMAT_VERSION
    payload = orjson.dumps(data)
    return cipher.encrypt(payload) if cipher is not None else payload


def decode_snapshot(raw: bytes, cipher: SnapshotCipher | None) -> Snapshot:
    """The snapshot in ``raw``; raises ``Unreadable`` or ``NewerFormat``."""
    data = _json_object(raw, cipher)
    fv = _checked_fields(data)
    try:
        snapshot = Snapshot(**data)
    except TypeError as exc:  # a required field is missing
        raise Unreadable("missing fields") from exc
    if fv == 1 and not snapshot.anchor_hash.startswith(LEGACY_ANCHOR):
        return replace(snapshot, anchor_hash=LEGACY_ANCHOR + snapshot.anchor_hash)
    return snapshot


def _json_object(raw: bytes, cipher: SnapshotCipher | None) -> dict[str, Any]:
    """``raw`` decrypted (unless it predates encryption, where that is allowed) and read
    as a JSON object; raises ``Unreadable``."""
    if cipher is not None and raw.startswith(b"{") and not cipher.read_plaintext:
        raise Unreadable("stored in plaintext (store.require_encryption)")
    try:
        if cipher is not None and not raw.startswith(b"{"):  # plain JSON predates encryption
            raw = cipher.decrypt(raw)
        data: Any = orjson.loads(raw)
    except StoreError as exc:
        raise Unreadable("cannot be decrypted") from exc
    except orjson.JSONDecodeError as exc:
        # Without keys, an encrypted snapshot is just bytes that are not JSON.
        raise Unreadable("not JSON" if cipher else "not JSON (encrypted?)") from exc
    if not isinstance(data, dict):
        raise Unreadable("not a JSON object")
    return data


def _checked_fields(data: dict[str, Any]) -> int:
    """The format version ``data`` is written in, taken out of it, once each other field
    is one a snapshot has, of its type; raises ``Unreadable`` or ``NewerFormat``."""
    fv = data.pop("fv", None)
    if type(fv) is int and fv > FORMAT_VERSION:
        raise NewerFormat
    if type(fv) is not int or fv not in _READABLE_FORMATS:
        raise Unreadable("older format")
    for name, value in data.items():
        allowed = _FIELD_TYPES.get(name)
        if allowed is None or type(value) is bool or not isinstance(value, allowed):
            raise Unreadable("unexpected fields")
    return fv


def decode_stored(
    version: bytes | None, raw: bytes | None, cipher: SnapshotCipher | None
) -> Snapshot:
    """The snapshot in a stored hash's ``v`` and ``d`` fields (None when absent)."""
    if raw is None:
        raise Unreadable("no data")
    snapshot = decode_snapshot(raw, cipher)
    # The compare-and-swap reads ``v``: a mismatch would block every later write.
    if version is None or version != str(snapshot.version).encode():
        raise Unreadable("version field does not match")
    return snapshot


def window_tokens(raw: bytes | str) -> int | None:
    """A stored learned window; None if it is not a positive token count."""
    try:
        tokens = int(raw)
    except ValueError:
        return None
    return tokens if tokens > 0 else None


def encode_sighting(sighting: Sighting) -> bytes:
    # Counts and a model name, no content: stored in the clear, encryption or not.
    return orjson.dumps([sighting.messages, sighting.tokens, sighting.model, sighting.seen_at])


def decode_sighting(raw: bytes | str) -> Sighting | None:
    """A stored sighting; None for anything this release did not write."""
    try:
        messages, tokens, model, seen_at = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    counts = (messages, tokens)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
        return None
    if not isinstance(model, str) or not isinstance(seen_at, int | float):
        return None
    return Sighting(messages, tokens, model, float(seen_at))


def encode_original(original: Original, cipher: SnapshotCipher | None) -> bytes:
    """One archived message as Redis keeps it: JSON, encrypted like snapshots."""
    o = original
    payload = orjson.dumps([o.position, o.role, o.tool, o.text, o.digest])
    return cipher.encrypt(payload) if cipher is not None else payload


def decode_original(raw: bytes, cipher: SnapshotCipher | None) -> Original | None:
    """An archived message; None for what this release did not write or cannot decrypt
    (``store.require_encryption`` refuses plaintext)."""
    try:
        if cipher is not None and not raw.startswith(b"["):
            raw = cipher.decrypt(raw)
        elif cipher is not None and not cipher.read_plaintext:
            return None
        position, role, tool, text, digest = orjson.loads(raw)
    except (StoreError, orjson.JSONDecodeError, TypeError, ValueError):
        return None
    if type(position) is not int or not all(isinstance(v, str) for v in (role, tool, text)):
        return None
    return Original(position, role, text, tool, digest if isinstance(digest, str) else "")
