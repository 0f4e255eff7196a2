"""Readable twins of the proxy's fast paths, for tests only: each says in one call what
the proxy computes inline or through a lower-level function, so a test reads as the
behaviour it checks. None is called by ``proxy/``."""

from __future__ import annotations

from typing import Any

from proxy.core.ledger import Entry
from proxy.core.prices import Price, sides
from proxy.core.values import find_values
from proxy.observe.logs import request_line_writer


def find_identifiers(text: str) -> list[str]:
    """The keys of the values in ``text``, each once, most recently used last."""
    return [value.key for value in find_values(text)]


def money_saved(entry: Entry, price: Price, summarizer: Price | None) -> float:
    """USD ``entry`` saved at ``price`` (the request's model), its summarizer tokens at
    ``summarizer`` (the summarizer model's; None: ``price``)."""
    would, paid = sides(entry, price, summarizer)
    return would - paid


def write_request_line(fields: dict[str, Any]) -> None:
    """One request's line, at info level on ``ACCESS``, as the recorder writes one."""
    write = request_line_writer()  # None: ACCESS writes no info lines
    if write is not None:
        write(str(fields.get("request_id")), lambda values: values, fields)
