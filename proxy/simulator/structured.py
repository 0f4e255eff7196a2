"""Structured output: ``response_format`` ``json_object`` and ``json_schema``.

A model asked for JSON answers JSON. The simulator keeps its text reply (a
recalled fact, or filler) and puts it where a structured-output client can
read it: in every string the schema asks for (``{"answer": ...}`` for a bare
``json_object``), with the first allowed value of an enum or const, the
smallest allowed number and array, and ``false``. The answer is deterministic
and valid against the schema, so clients like ``.parse()`` can be tested.
"""

from __future__ import annotations

from typing import Any

import orjson

# Nested references deeper than this (a recursive schema) stop at null/empty values.
_MAX_DEPTH = 16


def structured_text(response_format: object, text: str) -> str | None:
    """The JSON answer ``response_format`` asks for, carrying ``text``; None when the
    request asks for plain text (or names no format this simulator knows)."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return orjson.dumps({"answer": text}).decode()
    spec = response_format.get("json_schema")
    if kind != "json_schema" or not isinstance(spec, dict):
        return None
    schema = spec.get("schema")
    root = schema if isinstance(schema, dict) else {}
    return orjson.dumps(_instance(root, root, text, 0)).decode()


def _instance(schema: dict[str, Any], root: dict[str, Any], text: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        return _instance(_referred(ref, root), root, text, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for combinator in ("anyOf", "oneOf", "allOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options and isinstance(options[0], dict):
            return _instance(options[0], root, text, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _typed(kind, schema, root, text, depth)


def _referred(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    """The schema a local ``$ref`` ("#/...") points to in ``root``; {} when none."""
    target: Any = root
    for part in ref[2:].split("/"):
        target = target.get(part, {}) if isinstance(target, dict) else {}
    return target if isinstance(target, dict) else {}


def _typed(kind: str, schema: dict[str, Any], root: dict[str, Any], text: str, depth: int) -> Any:
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {
            name: _instance(sub if isinstance(sub, dict) else {}, root, text, depth + 1)
            for name, sub in properties.items()
        }
    if kind == "array":
        items = schema.get("items")
        item = _instance(items if isinstance(items, dict) else {}, root, text, depth + 1)
        return [item] * int(schema.get("minItems", 0))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = low + 1 if "exclusiveMinimum" in schema else low
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return text
