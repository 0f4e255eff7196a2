"""The OpenAI Chat Completions wire format, as far as the proxy reads it.

``Any`` stops here: everything past parsing works with these TypedDicts.
Fields the proxy does not read are forwarded untouched and not listed.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    id: str
    type: str
    function: FunctionCall


# A content part of the proxy's own: a Responses ``item_reference`` to an output the
# proxy does not hold (routes/items.py), priced by tokens.py, named by transcript.py.
UNSEEN_ITEM = "unseen_item"


class ChatMessage(TypedDict):
    role: str
    content: NotRequired[str | list[dict[str, Any]] | None]
    name: NotRequired[str]
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]


class ChatRequest(TypedDict):
    model: str
    messages: list[ChatMessage]
    stream: NotRequired[bool]
    max_tokens: NotRequired[int | None]
    max_completion_tokens: NotRequired[int | None]
    tools: NotRequired[list[dict[str, Any]]]
    functions: NotRequired[list[dict[str, Any]]]
    response_format: NotRequired[dict[str, Any]]
