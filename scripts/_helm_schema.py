"""The `config` part of the chart's values.schema.json, generated from the proxy's Settings.

The chart renders values' ``config`` block as the proxy's config.yaml, so what
helm accepts there must be what ``load_settings`` accepts: this derives it from
``Settings.model_json_schema()`` (references inlined, so any helm v3's JSON
schema validator reads it; titles and defaults dropped, since values.yaml holds
the defaults). Secret fields (SecretStr: ``writeOnly``) are left out, so a key
written under ``config`` fails the install: keys go in ``secrets`` and reach the
pod as environment variables, never the ConfigMap. Checks across fields
(target_ratio below trigger_ratio, URL schemes) stay with the proxy, which
refuses to start on them.

``scripts/helm-schema`` rewrites that part of values.schema.json in place (the
rest of the file is written by hand); ``--check`` only compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from proxy.config import Settings

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "helm/compaction-proxy/values.schema.json"
_DROPPED_KEYWORDS = frozenset({"title", "default"})


def _is_secret(schema: dict[str, Any]) -> bool:
    items = schema.get("items")
    return bool(schema.get("writeOnly")) or (isinstance(items, dict) and _is_secret(items))


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = defs[ref.removeprefix("#/$defs/")]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYWORDS:
            continue
        if key == "properties":
            out[key] = {
                name: _inline(prop, defs)
                for name, prop in value.items()
                if not _is_secret(_inline(prop, defs))
            }
        else:
            out[key] = _inline(value, defs)
    return out


def config_schema() -> dict[str, Any]:
    """JSON schema (draft-07 compatible, self-contained) of values' ``config`` block."""
    raw = Settings.model_json_schema()
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = {
        "description": "The proxy's config.yaml (config.example.yaml) without its secrets. "
        "Generated from proxy.config.Settings by scripts/helm-schema: do not edit by hand.",
    }
    schema.update(_inline(raw, defs))
    return schema


def render(current: dict[str, Any]) -> str:
    """values.schema.json's text with its ``config`` part regenerated."""
    current.setdefault("properties", {})["config"] = config_schema()
    return json.dumps(current, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = SCHEMA_FILE.read_text(encoding="utf-8")
    wanted = render(json.loads(text))
    if "--check" in argv:
        if text != wanted:
            print(f"{SCHEMA_FILE} is out of date: run scripts/helm-schema", file=sys.stderr)
            return 1
        return 0
    if text != wanted:
        SCHEMA_FILE.write_text(wanted, encoding="utf-8")
        print(f"rewrote the config part of {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
