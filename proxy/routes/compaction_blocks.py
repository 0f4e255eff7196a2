"""Anthropic's ``compaction`` blocks, written and read by the proxy for an upstream without
context management (context_edits.py): the block for a view the proxy summarized, its
summary readable and what it sent sealed for the tenant, and a later request read as the
API reads a block (everything before the newest one dropped, the block standing for what
it carries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from proxy.core.wording import handoff_text
from proxy.errors import InvalidRequest
from proxy.routes.compaction_items import Sealer
from proxy.routes.messages_chat import Message, blocks_of

_PAYLOAD = 1  # the format of a sealed compaction block's payload
_OURS = ("cps1.", "cpe1.")  # Sealer's prefixes


def compaction_block(sent: list[Message], tenant: str, sealer: Sealer) -> dict[str, Any]:
    """The ``compaction`` block for a view the proxy summarized: its summary readable in
    ``content``, and every message it sent (the handoff, then the verbatim tail) sealed
    for ``tenant`` in ``encrypted_content``, which ``expanded`` reads back."""
    first = blocks_of(sent[0].get("content")) if sent else []
    summary = "\n\n".join(str(b.get("text", "")) for b in first if b.get("type") == "text")
    payload = {"v": _PAYLOAD, "t": tenant, "messages": sent}
    return {
        "type": "compaction",
        "content": summary or None,
        "encrypted_content": sealer.seal(payload),
    }


def carries_compaction(body: bytes, messages: Sequence[Message]) -> bool:
    """Whether an assistant message holds a ``compaction`` block (a byte search first)."""
    if b'"compaction"' not in body:
        return False
    return any(
        m.get("role") == "assistant"
        and any(b.get("type") == "compaction" for b in blocks_of(m.get("content")))
        for m in messages
    )


def expanded(messages: list[Message], tenants: tuple[str, ...], sealer: Sealer) -> list[Message]:
    """``messages`` as the API reads a compaction block: everything before the newest one
    dropped, the block read as what it stands for (one the proxy sealed: the messages it
    sent; another's: its summary as a user turn; one without content: nothing, a no-op);
    neighbours of one role merged so the turns still alternate. A block sealed here that
    does not open for ``tenants`` is a 400."""
    at = [
        (i, k)
        for i, m in enumerate(messages)
        if m.get("role") == "assistant"
        for k, b in enumerate(blocks_of(m.get("content")))
        if b.get("type") == "compaction"
    ]
    i, k = at[-1]
    content = blocks_of(messages[i].get("content"))
    block, rest = content[k], [b for b in content[k + 1 :] if b.get("type") != "compaction"]
    carried = _carried(block, i, k, tenants, sealer)
    if carried is None:  # a no-op: the block left out, nothing dropped
        before = [b for b in content if b is not block]
        head = [*messages[:i], *([{**messages[i], "content": before}] if before else [])]
        return _merged([*head, *messages[i + 1 :]])
    tail = [{**messages[i], "content": rest}] if rest else []
    return _merged([*carried, *tail, *messages[i + 1 :]])


def _carried(
    block: dict[str, Any], i: int, k: int, tenants: tuple[str, ...], sealer: Sealer
) -> list[Message] | None:
    sealed, text = block.get("encrypted_content"), block.get("content")
    if isinstance(sealed, str) and sealed.startswith(_OURS):
        payload = sealer.open(sealed)
        carried = payload.get("messages") if payload is not None else None
        ok = payload is not None and payload.get("v") == _PAYLOAD and payload.get("t") in tenants
        if not ok or not isinstance(carried, list) or not carried:
            raise InvalidRequest(
                f"messages.{i}.content.{k}: the compaction block could not be verified.",
                param=f"messages.{i}.content.{k}",
            )
        for n, message in enumerate(carried):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise InvalidRequest(
                    f"messages.{i}.content.{k} carries messages.{n}, which is not a message.",
                    param=f"messages.{i}.content.{k}",
                )
        return cast(list[Message], carried)
    if isinstance(text, str) and text:
        return [{"role": "user", "content": [{"type": "text", "text": handoff_text(text)}]}]
    return None


def _merged(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    for message in messages:
        if out and out[-1].get("role") == message.get("role"):
            content = blocks_of(out[-1].get("content")) + blocks_of(message.get("content"))
            out[-1] = {**out[-1], "content": content}
        else:
            out.append(message)
    if out and out[0].get("role") == "assistant":  # the API's first turn is the user's
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "Continue."}]})
    return out
