"""OpenAI's compaction contract for any upstream: ``compaction_trigger``,
``POST /v1/responses/compact``, ``context_management`` and ``compaction`` items.

``upstream.compaction`` says who serves the contract. ``passthrough`` (``auto`` when
the upstream is api.openai.com): the upstream does; a request that uses the contract
(a trigger, ``context_management``, a ``compaction`` item in ``input``) or calls
``/responses/compact`` goes upstream untouched, never compacted by the proxy too (its
``compaction`` items are the upstream's, opaque here). ``proxy`` (``auto`` for any other
upstream): the proxy does, from its own pipeline:

* a trigger (the last input item, one only: else a 400 in OpenAI's shape) or a call
  to ``/responses/compact`` compacts the session now (``X-Compaction: force``'s path,
  rate limit included) and the proxy answers itself, no upstream generation: a
  ``response`` (streamed when asked) whose output is one ``compaction`` item, or a
  ``response.compaction`` whose output is the input's user messages then that item;
* the item's ``encrypted_content`` carries the compacted view after the pinned
  messages (the handoff summary, then the verbatim tail, as input items) and a
  reference to the snapshot it comes from (tenant, session, version), sealed:
  Fernet with ``store.encryption_keys`` (the first encrypts, all decrypt: rotation),
  else an HMAC-SHA256 tag under a key derived from the deployment's upstream
  (``upstream.api_key`` and ``base_url``): signed, readable by the client;
* a later request's ``compaction`` item is expanded back into those items for the
  upstream (which could not read it), then planned like any history. One the proxy
  cannot verify, or sealed for another tenant, is refused: 400
  ``invalid_encrypted_content``, as OpenAI refuses an item it did not write;
* ``context_management`` is checked as OpenAI checks it (type ``compaction``, a
  ``compact_threshold`` of at least 1000) and not sent on; the proxy's own thresholds
  compact the request, and a prompt past ``compact_threshold`` is compacted as if
  forced (the answer carries no ``compaction`` item: the session's snapshot holds it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import orjson

from proxy.config import Settings
from proxy.errors import InvalidRequest, StoreError
from proxy.routes.items import ItemMessage, check_count, to_items
from proxy.store.codec import SnapshotCipher
from proxy.types import ChatMessage

TRIGGER = "compaction_trigger"
MIN_THRESHOLD = 1000
_FORMAT = 1
_SIGNED, _ENCRYPTED = "cps1.", "cpe1."
_LEADING = ("system", "developer")

Local = Literal["trigger", "compact"]


def passes_through(settings: Settings, host: str = "api.openai.com") -> bool:
    """Whether the upstream serves the contract itself (``upstream.compaction``; ``auto``:
    when it is ``host``, the API's own, as Anthropic's ``context_management`` asks of
    api.anthropic.com)."""
    mode = settings.upstream.compaction
    if mode == "auto":
        return urlsplit(settings.upstream.base_url).hostname == host
    return mode == "passthrough"


class Sealer:
    """Seals and opens the payload of the proxy's ``compaction`` items."""

    def __init__(self, settings: Settings) -> None:
        keys = [k.get_secret_value() for k in settings.store.encryption_keys]
        self._cipher = SnapshotCipher(keys) if keys else None
        secret = settings.upstream.api_key.get_secret_value()
        material = f"compaction-proxy compaction item\0{secret}\0{settings.upstream.base_url}"
        self._key = hashlib.sha256(material.encode()).digest()

    def seal(self, payload: dict[str, Any]) -> str:
        data = orjson.dumps(payload)
        if self._cipher is not None:
            return _ENCRYPTED + self._cipher.encrypt(data).decode()
        tag = hmac.new(self._key, data, hashlib.sha256).digest()
        return _SIGNED + _b64(data) + "." + _b64(tag)

    def open(self, token: str) -> dict[str, Any] | None:
        """The payload ``token`` seals, or None when it is not one this proxy sealed."""
        try:
            if token.startswith(_ENCRYPTED) and self._cipher is not None:
                data = self._cipher.decrypt(token.removeprefix(_ENCRYPTED).encode())
            elif token.startswith(_SIGNED) and self._cipher is None:
                body, _, tag = token.removeprefix(_SIGNED).partition(".")
                data = base64.urlsafe_b64decode(body + "==")
                mine = hmac.new(self._key, data, hashlib.sha256).digest()
                if not hmac.compare_digest(mine, base64.urlsafe_b64decode(tag + "==")):
                    return None
            else:
                return None
            payload = orjson.loads(data)
        except (StoreError, binascii.Error, ValueError):
            return None
        return payload if isinstance(payload, dict) and payload.get("v") == _FORMAT else None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A Responses request as the pipeline takes it under the contract: its (maybe
    rewritten) object, whether it changed, whether it goes upstream untouched, what the
    proxy answers itself (None: the upstream answers), and a threshold past which it is
    compacted as if forced (``context_management``)."""

    data: dict[str, Any]
    changed: bool = False
    untouched: bool = False
    local: Local | None = None
    threshold: int | None = None


def admit(
    data: dict[str, Any], tenants: tuple[str, ...], settings: Settings, compact: bool
) -> Admitted:
    """``data`` (a ``/responses`` request, or ``/responses/compact``'s when ``compact``)
    under the contract, for the caller's tenant (then the legacy id it is still known
    by: an item sealed before the deployment's ids moved opens too); raises
    InvalidRequest (the client's 400)."""
    raw = data.get("input")
    items: list[dict[str, Any]] = raw if isinstance(raw, list) else []
    trigger = _trigger(items)
    uses = trigger or compact or "context_management" in data
    if passes_through(settings):
        uses = uses or _carries_compaction(items)
        return Admitted(data, untouched=uses)
    threshold = _threshold(data.get("context_management"))
    if not uses and not _carries_compaction(items):
        return Admitted(data)
    if trigger:
        items = items[:-1]
    expanded = _expand(items, tenants, Sealer(settings))
    check_count(len(expanded), settings.server.max_messages, expanded=True)
    new = {k: v for k, v in data.items() if k != "context_management"}
    if isinstance(raw, list):
        new["input"] = expanded
    local: Local | None = "compact" if compact else "trigger" if trigger else None
    return Admitted(new, changed=True, local=local, threshold=threshold)


def _carries_compaction(items: list[dict[str, Any]]) -> bool:
    """Whether ``items`` hold a compaction item (what an earlier compaction answered)."""
    return any(item.get("type") == "compaction" for item in items)


def _trigger(items: list[dict[str, Any]]) -> bool:
    """Whether ``items`` end with a trigger; one anywhere else is a 400."""
    at = [i for i, item in enumerate(items) if item.get("type") == TRIGGER]
    for i in at:
        if i != len(items) - 1:
            raise InvalidRequest(
                f"Invalid 'input[{i}]': a 'compaction_trigger' item must be the last input item.",
                param=f"input[{i}]",
                code="invalid_value",
            )
    return bool(at)


def _threshold(raw: object) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest(
            "Invalid type for 'context_management': expected an array of objects.",
            param="context_management",
            code="invalid_type",
        )
    found: int | None = None
    for i, entry in enumerate(raw):
        param = f"context_management[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "compaction":
            raise InvalidRequest(
                f"Invalid value for '{param}.type': only 'compaction' is supported.",
                param=f"{param}.type",
                code="invalid_value",
            )
        value = entry.get("compact_threshold")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < MIN_THRESHOLD:
            raise InvalidRequest(
                f"Invalid '{param}.compact_threshold': expected an integer of at least "
                f"{MIN_THRESHOLD}.",
                param=f"{param}.compact_threshold",
                code="integer_below_min_value",
            )
        found = value
    return found


def _expand(
    items: Sequence[dict[str, Any]], tenants: tuple[str, ...], sealer: Sealer
) -> list[dict[str, Any]]:
    """Each ``compaction`` item as the items it carries; one not sealed here for one of
    ``tenants`` is a 400, and so is one that carries anything but objects: a payload
    that verifies was still written by whoever holds the key, which without
    ``upstream.api_key`` or ``store.encryption_keys`` anyone may derive, so what it
    carries is checked as ``input`` is (the count, by the caller, on the whole)."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if item.get("type") != "compaction":
            out.append(item)
            continue
        content = item.get("encrypted_content")
        payload = sealer.open(content) if isinstance(content, str) else None
        carried = payload.get("items") if payload is not None else None
        if payload is None or payload.get("t") not in tenants or not isinstance(carried, list):
            raise InvalidRequest(
                f"The encrypted content for item {item.get('id') or f'input[{i}]'} could not "
                "be verified.",
                param=f"input[{i}]",
                code="invalid_encrypted_content",
            )
        for k, carried_item in enumerate(carried):
            if not isinstance(carried_item, dict):
                raise InvalidRequest(
                    f"input[{i}] carries items[{k}], which must be an object.",
                    param=f"input[{i}]",
                    code="invalid_encrypted_content",
                )
        out.extend(cast(list[dict[str, Any]], carried))
    return out


def compaction_item(
    messages: Sequence[ChatMessage], tenant: str, reference: tuple[str, int], sealer: Sealer
) -> dict[str, Any]:
    """The ``compaction`` item for a compacted view (``messages``): the items after its
    pinned messages, and the snapshot ``reference`` (session id, version)."""
    start = 0
    while start < len(messages) and _pinned(messages[start]):
        start += 1
    session, version = reference
    payload = {
        "v": _FORMAT,
        "t": tenant,
        "s": session,
        "n": version,
        "items": to_items(messages[start:]),
    }
    digest = hashlib.blake2b(orjson.dumps(payload), digest_size=12).hexdigest()
    return {"id": f"cmp_{digest}", "type": "compaction", "encrypted_content": sealer.seal(payload)}


def _pinned(message: ChatMessage) -> bool:
    # The client's own leading system/developer messages (or instructions): the
    # proxy's handoff (no _items) is not pinned, whatever its role.
    return message.get("role") in _LEADING and "_items" in cast(ItemMessage, message)


def user_messages(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input's user messages, as ``/responses/compact`` lists them first: message
    items, their text as ``input_text`` parts."""
    out = []
    for item in items:
        if item.get("type", "message") == "message" and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "input_text", "text": content}]
            out.append({**item, "type": "message", "content": content})
    return out


def created_at() -> int:
    return int(time.time())
