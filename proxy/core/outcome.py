"""The values one chat request's compaction steps share: its ``Turn``, its ``Outcome``,
and the ``FollowUp`` work that travels beside an outcome, never inside it.

``Outcome.headers`` renders the response headers that tell the client what the
upstream saw (``X-Compaction-Status``, ``-Version``, ``X-Context-Tokens``, ``-Window``),
and ``X-Compaction-Degraded`` when the turn was due a summary it did not get, and
``X-Compaction-Recalled`` when recall searched the archive (how many excerpts it added),
``X-Compaction-Recall-Tool`` when the recall tool was offered (how many calls it answered),
``X-Compaction-Output-Clamped`` when the output budget was lowered to the model's limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from proxy.core.models import ResolvedModel
from proxy.types import ChatMessage, ChatRequest

if TYPE_CHECKING:  # annotations only: a turn's policy comes resolved (pipeline.py)
    from proxy.config import CompactionSettings
    from proxy.core.session import SessionKey
    from proxy.tenants import Policy

Status = Literal["passthrough", "snapshot", "compacted", "trimmed", "bypassed", "shadow"]
# What a shadow turn's view would have been (compaction/shadow.py): a closed set, a label.
ShadowStatus = Literal["passthrough", "snapshot", "compacted", "trimmed", "failed"]
# Why a turn that was due a summary was served without one (its status still says what
# the upstream saw): its own summary failed, or the one it waited for (another request's)
# ended without a snapshot, after the time that took; the one it waited for was still
# running when compaction.wait_for_summary_s ran out (late); or the session's back-off
# after failures skipped it (backoff.py); or its tenant is over that cap of its policy
# (tenants.py: trimmed instead); or its own summary outlived compaction.summary_deadline_s
# (finishing in the background, or dropped), or the model's summaries are known to take
# longer than that, so none was asked (compaction/turn_deadline.py). And a turn sent while
# a summary of the proxy's own ran on its model, which a single-slot server queues it
# behind (summary_busy: compaction/busy.py). A closed set: a metric label.
Degraded = Literal[
    "summary_failed",
    "summary_late",
    "backoff",
    "summaries_per_hour",
    "summarizer_tokens_per_day",
    "summary_deadline",
    "summary_slow",
    "summary_busy",
]
# Work to start once a turn's model answer has gone out (a stream: once it has ended):
# the write of its session's sighting (sightings.py), a background pre-compaction
# (precompact.py). Returned beside the view it follows, run in order (pipeline.forward).
FollowUp = Callable[[], Awaitable[None]]
# A body sent uncounted is sized at this many bytes a token: a rough estimate.
_ESTIMATE_BYTES_PER_TOKEN = 4


class Wire(Protocol):
    """What a summary asked as a turn's own request needs of the API it came on
    (upstream/api.py's ``Api``; compaction/summary_prefix.py asks)."""

    @property
    def name(self) -> str: ...

    def summary_body(
        self, data: dict[str, Any], messages: list[ChatMessage], max_tokens: int
    ) -> tuple[bytes, int] | None: ...


@dataclass(frozen=True, slots=True)
class Turn:
    """One chat request, as the compaction steps see it."""

    chat: ChatRequest
    body: bytes
    model: ResolvedModel
    tenant: str
    session_header: str | None
    auth_headers: list[tuple[bytes, bytes]]
    # Items the history names by reference (Responses' item_reference), and how many of
    # those the proxy could not read (each priced at tokens.UNSEEN_ITEM_TOKENS).
    references: int = 0
    unresolved: int = 0
    policy: Policy | None = None  # its tenant's entry in `tenants:`; None: the default
    # The API it came on and its request object (parsed from ``body``): a summary asked as
    # the request itself needs its shapes (compaction/summary_prefix.py). None: unknown.
    api: Wire | None = None
    data: dict[str, Any] | None = None
    # Input tokens past which it compacts when lower than its model's trigger (the
    # request's own ``compact_*`` edit: routes/context_edits.py); None: the model's.
    trigger: int | None = None

    def compaction(self, default: CompactionSettings) -> CompactionSettings:
        """The compaction settings this turn compacts with: its tenant's, or ``default``."""
        return default if self.policy is None else self.policy.compaction


@dataclass(frozen=True, slots=True)
class Shadow:
    """What shadow mode would have sent instead of the body it forwarded untouched."""

    status: ShadowStatus
    version: int  # of the shadow snapshot it would have applied
    tokens: int  # the input tokens it would have sent, the proxy's count
    summarizer: tuple[int, int]  # the summary it would have asked for: input, output (est.)
    history: int  # the input tokens of the history as sent, the proxy's count

    @property
    def saved(self) -> int:
        """The ledger's net (core/ledger.py), estimated in the proxy's counts."""
        return self.history - self.tokens - sum(self.summarizer)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The API view for one request; ``messages`` None means send the body as is."""

    status: Status
    messages: list[ChatMessage] | None
    version: int
    tokens: int
    window: int
    # False when ``tokens`` is a rough size estimate, not a count.
    counted: bool = True
    # Identifiers the new summary had lost and the proxy put back (identifiers.py).
    restored: int = 0
    degraded: Degraded | None = None
    shadow: Shadow | None = None  # status "shadow": what it would have sent instead
    # Excerpts of archived originals put before the newest user message (recall.py);
    # None: recall did not look (no summary's view, or recall off).
    recalled: int | None = None
    # The session whose archive a recall tool may search (compaction/recall_tool.py): set
    # on a compacted view of a request with tools whose archive holds passages; and how
    # many of the tool's calls the proxy answered before this answer (None: none offered).
    archive: SessionKey | None = None
    tool_rounds: int | None = None
    # The output budget the request was sent with when the proxy lowered the client's to
    # the model's output limit (upstream/ceilings.py); None: sent as the client asked.
    clamped: int | None = None

    @classmethod
    def bypassed(cls, body: bytes, window: int) -> Outcome:
        """``body`` sent as it is, uncounted, on the client's word (``X-Compaction: off``)
        or its API's (a chained call: the history is not in sight)."""
        tokens = len(body) // _ESTIMATE_BYTES_PER_TOKEN
        return cls("bypassed", None, 0, tokens, window, counted=False)

    @classmethod
    def passthrough(cls, body: bytes, window: int) -> Outcome:
        """``body`` sent as it is, uncounted: nothing asks for a compaction (it is
        disabled, the body is far below the trigger, or it holds no message)."""
        tokens = len(body) // _ESTIMATE_BYTES_PER_TOKEN
        return cls("passthrough", None, 0, tokens, window, counted=False)

    @classmethod
    def unchanged(cls, tokens: int, window: int) -> Outcome:
        """The history as sent, counted at ``tokens``: no snapshot applies to it."""
        return cls("passthrough", None, 0, tokens, window)

    @classmethod
    def rebuilt(
        cls, messages: list[ChatMessage], version: int, tokens: int, window: int
    ) -> Outcome:
        """``messages`` rebuilt under the snapshot of ``version``, counted at ``tokens``."""
        return cls("snapshot", messages, version, tokens, window)

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"x-compaction-status", self.status.encode()),
            (b"x-compaction-version", str(self.version).encode()),
            (b"x-context-tokens", str(self.tokens).encode()),
            (b"x-context-window", str(self.window).encode()),
        ]
        if self.degraded is not None:
            headers.append((b"x-compaction-degraded", self.degraded.encode()))
        if self.recalled is not None:
            headers.append((b"x-compaction-recalled", str(self.recalled).encode()))
        if self.tool_rounds is not None:
            headers.append((b"x-compaction-recall-tool", str(self.tool_rounds).encode()))
        if self.clamped is not None:
            headers.append((b"x-compaction-output-clamped", str(self.clamped).encode()))
        if self.shadow is not None:
            s = self.shadow
            headers.append((b"x-compaction-shadow-status", s.status.encode()))
            headers.append((b"x-compaction-shadow-version", str(s.version).encode()))
            headers.append((b"x-compaction-shadow-tokens", str(s.tokens).encode()))
            headers.append((b"x-compaction-shadow-saved", str(s.saved).encode()))
        return headers


def counted_as(outcome: Outcome) -> str:
    """A compaction's outcome label (metrics): its view's status, but ``failed`` for a
    summary that failed while the view still fit (served as it was, not trimmed)."""
    if outcome.degraded == "summary_failed" and outcome.status != "trimmed":
        return "failed"
    return outcome.status


def rejected_headers(window: int | None) -> dict[str, str]:
    """The headers of a chat request the proxy refused before sending anything upstream
    (its own error answer); the window once the request's model is known."""
    headers = {"x-compaction-status": "rejected", "x-compaction-version": "0"}
    headers["x-context-tokens"] = "0"
    if window is not None:
        headers["x-context-window"] = str(window)
    return headers
