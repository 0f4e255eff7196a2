"""Snapshot + tail -> the messages the upstream receives.

The output is the pinned messages (the same objects, verbatim), the summary
framed as a handoff, then the verbatim tail with old bulky tool outputs
replaced by placeholders. The summary messages are chosen so that user and
assistant turns still alternate (strict chat templates reject two user turns
in a row) and their text is a pure function of the summary and the
neighbouring roles, so the prefix stays byte-identical between compactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.core.budget import Budget
from proxy.core.history import History
from proxy.core.identifiers import split_carried
from proxy.core.omitted import elided_values
from proxy.core.outcome import Outcome
from proxy.core.view import View, elided, view_tokens
from proxy.core.wording import (
    ACKNOWLEDGEMENT,
    CONTINUE,
    QUOTED_INTRO,
    SummaryRole,
    elided_content,
    handoff_text,
)
from proxy.types import ChatMessage

if TYPE_CHECKING:
    from proxy.core.snapshot import Loaded

_LEADING_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class Handoff:
    """The summary a view carries ("" or None: none), the version of the snapshot it
    comes from (0: none), and the role of the message that hands it over."""

    summary: str | None
    version: int
    role: SummaryRole = "user"

    @classmethod
    def of(cls, loaded: Loaded, role: SummaryRole) -> Handoff:
        """The summary of the snapshot ``loaded`` as this history may use it."""
        return cls(loaded.summary, loaded.shown_version, role)


def _summary_messages(
    summary: str, before: str | None, after: str, summary_role: SummaryRole
) -> list[ChatMessage]:
    """The handoff between the role ``before`` it (None: nothing) and the role ``after`` it.

    A system handoff is used only where a system message is still part of the
    leading block and the conversation then opens with a user turn; everywhere
    else the handoff is a user or assistant turn that keeps the alternation.
    """
    opens = before is None or before in _LEADING_ROLES
    if summary_role == "system" and opens and after != "assistant":
        # Restored identifiers and the recap of omitted messages are quoted from user
        # and tool messages: never given a system message's authority. They follow as
        # a user turn the assistant acknowledges, so the turn after the handoff still
        # alternates.
        written, quoted = split_carried(summary)
        system = ChatMessage(role="system", content=handoff_text(written))
        if not quoted:
            return [system]
        return [
            system,
            ChatMessage(role="user", content=f"{QUOTED_INTRO}\n\n{quoted}"),
            ChatMessage(role="assistant", content=ACKNOWLEDGEMENT),
        ]
    text = handoff_text(summary)
    if before == "user":
        handoff = ChatMessage(role="assistant", content=text)
        if after == "assistant":
            return [handoff, ChatMessage(role="user", content=CONTINUE)]
        return [handoff]
    handoff = ChatMessage(role="user", content=text)
    if after == "assistant":
        return [handoff]
    # A system/developer or tool message after the handoff is treated like a user turn.
    return [handoff, ChatMessage(role="assistant", content=ACKNOWLEDGEMENT)]


def rebuild_messages(
    history: History,
    view: View,
    summary: str | None,
    elide_min_tokens: int,
    *,
    summary_role: SummaryRole = "user",
) -> list[ChatMessage]:
    """The outgoing messages for ``view``; never mutates ``history.messages``.

    ``messages[:pinned]`` come first as the same objects; the handoff follows when
    the view covers messages; then ``messages[view.covered:]``, where elided tool
    messages are copies whose content is a placeholder. The newest message is
    always last and unchanged. A view that covers messages needs a summary.
    """
    messages, pinned, counts = history.messages, history.pinned, history.counts
    if len(counts) != len(messages):
        raise ValueError(f"{len(counts)} token counts for {len(messages)} messages")
    if not 0 <= pinned <= view.covered or (messages and view.covered >= len(messages)):
        raise ValueError(f"view covers from {view.covered} of {len(messages)} with {pinned} pinned")
    out = list(messages[:pinned])
    if view.covered > pinned:
        if summary is None:
            raise ValueError("the view covers messages but there is no summary")
        before = messages[pinned - 1]["role"] if pinned else None
        after = messages[view.covered]["role"]
        out.extend(_summary_messages(summary, before, after, summary_role))
    start = len(out) - view.covered  # messages[i] goes to out[start + i]
    out.extend(messages[view.covered :])
    for i in elided(history, view, elide_min_tokens):
        message = messages[i].copy()
        values = elided_values(messages[i], history.digests[i])
        message["content"] = elided_content(messages[i], counts[i], values)
        out[start + i] = message
    return out


def rebuild_outcome(history: History, view: View, handoff: Handoff, budget: Budget) -> Outcome:
    """What the upstream sees under ``view``: the history as sent (``passthrough``) when
    the view leaves it untouched, else the rebuilt messages (``snapshot``, of
    ``handoff.version``)."""
    tokens = view_tokens(history, view, budget)
    tokens -= budget.reserve
    if view.covered == history.pinned and view.elide_before <= history.pinned:
        # No snapshot applied (none, or one this history no longer matches).
        return Outcome.unchanged(tokens, budget.window)
    summary, elide_min = handoff.summary or None, budget.elide_min_tokens
    rebuilt = rebuild_messages(history, view, summary, elide_min, summary_role=handoff.role)
    return Outcome.rebuilt(rebuilt, handoff.version, tokens, budget.window)
