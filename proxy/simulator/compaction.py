"""OpenAI's compaction contract, as the simulator serves it (so a proxy's pass-through
mode is testable against it).

* ``compaction_trigger`` (``{"type": "compaction_trigger"}``, no other field): an input
  item of ``POST /v1/responses`` that asks for the conversation to be compacted. It
  must be the last input item, and only one: anything else is a 400. The answer's
  output is exactly one ``compaction`` item (Codex's remote compaction v2 wants that).
* ``POST /v1/responses/compact``: ``model`` required, ``input`` and/or
  ``previous_response_id``; answers a ``response.compaction`` object whose ``output``
  is the input's user messages followed by one ``compaction`` item, with ``usage``.
* ``context_management: [{"type": "compaction", "compact_threshold": N}]`` on
  ``POST /v1/responses``: a list of objects, type ``compaction`` only, threshold an
  integer of at least 1000 (or null). A prompt over the threshold is compacted first:
  the answer's output starts with a ``compaction`` item, then the reply.
* A ``compaction`` input item (``encrypted_content`` the simulator wrote) reads as the
  summary it carries, a user message, so the reply rules (FACT/RECALL) see what it
  kept; one it did not write is a 400 ``invalid_encrypted_content``, as a reasoning
  item's is.

The summary is the simulator's own (replies.py rule 1: every ``FACT key=value``
carried forward), sealed like encrypted reasoning (items.py): opaque to a client,
tamper-evident, and expandable only here. The error wordings for a misplaced trigger
and a bad ``context_management`` are this simulator's, modelled on OpenAI's
``Invalid 'param': ...`` messages (its exact text is not published).
"""

from __future__ import annotations

from typing import Any

from proxy.simulator.errors import SimError, invalid_request
from proxy.simulator.items import seal, unsealed

TRIGGER = "compaction_trigger"
_PREFIX = "compaction:"
MIN_THRESHOLD = 1000


def _structure(message: str, param: str | None = None, code: str | None = None) -> SimError:
    return invalid_request(message, param=param, code=code, kind="structure")


def take_trigger(items: list[Any]) -> tuple[list[Any], bool]:
    """``items`` without their ``compaction_trigger``, and whether there was one; a
    trigger that is not the last item (or a second one) is a 400, as is one with
    fields besides ``type``."""
    at = [
        i for i, item in enumerate(items) if isinstance(item, dict) and item.get("type") == TRIGGER
    ]
    if not at:
        return items, False
    for i in at:
        if i != len(items) - 1:
            raise _structure(
                f"Invalid 'input[{i}]': a 'compaction_trigger' item must be the last input item.",
                param=f"input[{i}]",
                code="invalid_value",
            )
        extra = sorted(set(items[i]) - {"type"})
        if extra:
            raise _structure(
                f"Unknown parameter: 'input[{i}].{extra[0]}'.",
                param=f"input[{i}].{extra[0]}",
                code="unknown_parameter",
            )
    return items[:-1], True


def sealed_summary(summary: str) -> str:
    return seal(_PREFIX + summary)


def compaction_item(tag: str, summary: str) -> dict[str, Any]:
    return {"id": f"cmp_{tag}", "type": "compaction", "encrypted_content": sealed_summary(summary)}


def expand(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``compaction`` item as the user message of the summary it carries."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if item.get("type") != "compaction":
            out.append(item)
            continue
        content = item.get("encrypted_content")
        text = unsealed(content) if isinstance(content, str) else None
        if text is None or not text.startswith(_PREFIX):
            raise _structure(
                f"The encrypted content for item {item.get('id', f'input[{i}]')} could not be "
                "verified.",
                param=f"input[{i}]",
                code="invalid_encrypted_content",
            )
        summary = text.removeprefix(_PREFIX)
        out.append(
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": summary}],
            }
        )
    return out


def compact_threshold(body: dict[str, Any]) -> int | None:
    """The ``compact_threshold`` ``context_management`` asks for (None: none); a
    malformed list is a 400."""
    raw = body.get("context_management")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise invalid_request(
            "Invalid type for 'context_management': expected an array of objects.",
            param="context_management",
            code="invalid_type",
        )
    threshold: int | None = None
    for i, entry in enumerate(raw):
        param = f"context_management[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "compaction":
            raise invalid_request(
                f"Invalid value for '{param}.type': only 'compaction' is supported.",
                param=f"{param}.type",
                code="invalid_value",
            )
        value = entry.get("compact_threshold")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid_request(
                f"Invalid type for '{param}.compact_threshold': expected an integer.",
                param=f"{param}.compact_threshold",
                code="invalid_type",
            )
        if value < MIN_THRESHOLD:
            raise invalid_request(
                f"Invalid '{param}.compact_threshold': integer below minimum value. Expected a "
                f"value >= {MIN_THRESHOLD}, but got {value} instead.",
                param=f"{param}.compact_threshold",
                code="integer_below_min_value",
            )
        threshold = value
    return threshold


def user_messages(items: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """The input's user messages as ``/responses/compact`` lists them in its output."""
    out = []
    for n, item in enumerate(items):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "input_text", "text": content}]
            out.append(
                {
                    "id": f"msg_{tag}_{n}",
                    "type": "message",
                    "status": "completed",
                    "role": "user",
                    "content": content,
                }
            )
    return out
