"""Responses ``item_reference`` inputs read as the output items they name (issue 24).

A client with ``store: true`` sends an earlier answer back by its id. The proxy relayed
that answer and remembered its items (upstream/output_items.py), so before counting it
looks the ids up (one store round trip) and reads each reference as its item: counted,
planned and summarized as what the model will see. The request still goes upstream with
the reference, which the upstream resolves. A reference the proxy cannot read (its
answer went another way, is older than ``store.ttl_s``, or was too big to keep) is
priced at ``tokens.UNSEEN_ITEM_TOKENS``, counted in ``item_references_total`` and
reported in the response (``X-Compaction-Unresolved-References``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.observe.record import current_record
from proxy.store import ItemStore
from proxy.types import ChatRequest
from proxy.upstream.api import Api, Route

Watch = Callable[[bytes], None]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A request's chat view with its references read, and how many it had and missed."""

    chat: ChatRequest
    references: int = 0
    unresolved: int = 0


async def resolve_references(
    items: ItemStore, api: Api, tenant: str, data: dict[str, Any], chat: ChatRequest
) -> Resolved:
    """``chat`` (``data``'s view under ``api``) with each item reference read as the item
    ``tenant``'s answers had under its id; ``chat`` itself when it has none."""
    ids = api.references(data) if api.names_items else []
    if not ids:
        return Resolved(chat)
    unique = list(dict.fromkeys(ids))
    found: dict[str, Any] = {}
    for item_id, raw in zip(unique, await items.recall_items(tenant, unique), strict=True):
        item = _item(raw)
        if item is not None:
            found[item_id] = item
    missed = sum(1 for i in ids if i not in found)
    if not found:
        return Resolved(chat, len(ids), missed)
    return Resolved(api.resolved(data, found), len(ids), missed)


def _item(raw: bytes | None) -> dict[str, Any] | None:
    """A kept item, if it reads as one (never another reference)."""
    if raw is None:
        return None
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(item, dict) or item.get("type") == "item_reference":
        return None
    return item


def reference_headers(outcome: Outcome, turn: Turn | None) -> list[tuple[bytes, bytes]]:
    """The view's headers, where its window came from (``turn``'s model: a models: entry,
    the registry, the default, or learned since), a cache-aware turn's plan for a newer
    snapshot (the record's, held.py), and how many items named by reference the proxy
    could not read."""
    headers = outcome.headers()
    if turn is None:
        return headers
    plan = current_record().cache_plan  # a cache-aware turn's, for a newer snapshot (held.py)
    if plan is not None:
        headers.append((b"x-compaction-cache-plan", plan.encode()))
    model = turn.model
    source = "learned" if outcome.window < model.context_window else model.source
    headers.append((b"x-context-window-source", source.encode()))
    if turn.unresolved:
        headers.append((b"x-compaction-unresolved-references", str(turn.unresolved).encode()))
    return headers


def kept_after(route: Route) -> tuple[FollowUp, ...]:
    """The follow-up that remembers the output items of ``route``'s answer, if it keeps them."""
    return () if route.items is None else (route.items.keep,)


def watching_items(route: Route, watch: Watch | None) -> Watch | None:
    """``watch``, and the output items ``route`` keeps, on each chunk of its answer."""
    items = route.items
    if items is None:
        return watch
    keep = items.watch
    if watch is None:
        return keep
    usage = watch

    def both(chunk: bytes) -> None:
        usage(chunk)
        keep(chunk)

    return both
