"""The Grafana dashboard the chart ships, and the PromQL expressions it queries, read apart
for the dashboard tests."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).parents[2]


DASHBOARD = ROOT / "helm/compaction-proxy/dashboards/compaction-proxy.json"


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


_RANGE = re.compile(r"\[[^\]]*\]")


_MATCHERS = re.compile(r"\{([^}]*)\}")


_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")


_IDENTIFIER = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?")


_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "bool", "and", "or", "unless", "offset"})


_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$")


def referenced(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names a PromQL expression (or a Grafana
    ``label_values(selector, label)`` query) refers to."""
    wanted_labels: set[str] = set()
    found = _LABEL_VALUES.match(expr)
    if found:
        expr = found.group(1)
        wanted_labels.add(found.group(2))
    # Matchers first: their values are strings, which are blanked next.
    for matchers in _MATCHERS.findall(expr):
        wanted_labels.update(_MATCHER_LABEL.findall(_STRING.sub('""', matchers)))
    text = _MATCHERS.sub(" ", _STRING.sub('""', expr))
    text = _RANGE.sub(" ", text)
    for grouping in _GROUPING.findall(text):
        wanted_labels.update(re.findall(r"[A-Za-z_]\w*", grouping))
    text = _VARIABLE.sub(" ", _GROUPING.sub(" ", text))
    names = {
        name
        for name, call in _IDENTIFIER.findall(text)
        if not call and name not in _KEYWORDS and not name.startswith("group_")
    }
    return names, wanted_labels


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(DASHBOARD.read_bytes())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold theirs


def expressions(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs
