"""The simulator's structured output: JSON valid against the schema asked for."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from proxy.simulator.structured import structured_text

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "count": {"type": "integer", "minimum": 3},
            "score": {"type": "number", "exclusiveMinimum": 0},
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "nested": {"$ref": "#/$defs/Inner"},
        },
        "required": ["answer", "count", "score", "ok", "kind", "tags", "maybe", "nested"],
        "additionalProperties": False,
        "$defs": {"Inner": {"type": "object", "properties": {"v": {"type": ["string", "null"]}}}},
    },
    {"type": "array", "items": {"type": "integer"}},
    {"type": "string"},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_answer_is_valid_against_the_schema(schema: dict[str, Any]) -> None:
    text = structured_text({"type": "json_schema", "json_schema": {"schema": schema}}, "k=v")
    assert text is not None
    jsonschema.validate(orjson.loads(text), schema)
    assert text == structured_text(
        {"type": "json_schema", "json_schema": {"schema": schema}}, "k=v"
    )


def test_the_text_reply_lands_in_the_strings() -> None:
    text = structured_text({"type": "json_schema", "json_schema": {"schema": SCHEMAS[0]}}, "k=v")
    assert orjson.loads(text or "")["answer"] == "k=v"
    assert structured_text({"type": "json_object"}, "k=v") == '{"answer":"k=v"}'


@pytest.mark.parametrize("fmt", [None, {"type": "text"}, "json", {"type": "json_schema"}])
def test_plain_text_stays_text(fmt: object) -> None:
    assert structured_text(fmt, "k=v") is None
