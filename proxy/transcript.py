"""What the summarizer reads: a span of the conversation as text, one entry per
message, tool calls as names and brief arguments, tool outputs shortened; and
that text cut into chunks that each fit one summary call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.types import ChatMessage

_ARG_CHARS = 300
_RESULT_CHARS = 800


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                elif part.get("type") == "image_url":
                    parts.append("[image]")
        return "\n".join(parts)
    return ""


def _brief(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more chars]"


def render_transcript(messages: Sequence[ChatMessage]) -> list[str]:
    """One entry per message; tool outputs shortened, tool calls as name(args)."""
    names: dict[str, str] = {}
    lines: list[str] = []
    for m in messages:
        role = m.get("role", "?")
        text = _text(m.get("content"))
        if role == "tool":
            name = names.get(str(m.get("tool_call_id", "")), "tool")
            lines.append(f"[tool result: {name}] {_brief(text, _RESULT_CHARS)}")
            continue
        entry = f"[{role}] {text}" if text else f"[{role}]"
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            names[str(call.get("id", ""))] = str(fn.get("name", "tool"))
            args = _brief(str(fn.get("arguments", "")), _ARG_CHARS)
            entry += f"\n[{role} calls {fn.get('name', 'tool')}({args})]"
        lines.append(entry)
    return lines


def span_text(messages: Sequence[ChatMessage]) -> str:
    """Everything a span says, whole (tool outputs and call arguments included), for the
    identifier check: the transcript the summarizer sees shortens those."""
    parts: list[str] = []
    for m in messages:
        parts.append(_text(m.get("content")))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(parts)


CONTINUED = "[continued] "  # opens each further part of a message longer than a chunk


def chunk_transcript(lines: list[str], max_chars: int) -> list[list[str]]:
    """``lines`` in order, in chunks of about ``max_chars`` characters at most; a longer
    line continues over several."""
    chunks: list[list[str]] = [[]]
    size = 0
    for line in _split_long(lines, max_chars):
        if chunks[-1] and size + len(line) > max_chars:
            chunks.append([])
            size = 0
        chunks[-1].append(line)
        size += len(line) + 1
    return chunks


def _split_long(lines: list[str], max_chars: int) -> list[str]:
    """A message longer than a chunk continues over several, losing nothing."""
    out: list[str] = []
    for line in lines:
        if len(line) <= max_chars:
            out.append(line)
            continue
        step = max(max_chars - 40, 1)
        parts = [line[i : i + step] for i in range(0, len(line), step)]
        out.extend(p if i == 0 else f"{CONTINUED}{p}" for i, p in enumerate(parts))
    return out
