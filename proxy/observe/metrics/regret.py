"""Post-compaction regret counted (core/regret.py): per session, the tool calls the
model made after a view that had dropped their earlier results, in a series of its own
and in the ledger's session and tenant totals.

Kept per session (bounded, least recently used dropped): how many messages its last
request's history had, and the calls that request's view left out, worked out again
only when the view's prefix changed (a new cut, an edit), not on every turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter

from proxy.core.regret import dropped, repeated

if TYPE_CHECKING:
    from proxy.observe.record import Record

_SESSIONS_LIMIT = 10_000
_NONE: frozenset[int] = frozenset()


class RegretLedger:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._sessions: LRUCache[str, tuple[int, frozenset[int]]] = LRUCache(_SESSIONS_LIMIT)
        self.calls = Counter(
            "compaction_proxy_regret_tool_calls",
            "Tool calls after a compaction that repeat one (the same tool and arguments) "
            "whose call or result the view the model answered had left out",
            registry=registry,
        )

    def observe(self, rec: Record, session: str, changed: bool) -> int:
        """The regretted calls among the messages ``rec``'s history added since the
        session's previous request; ``changed``: its view no longer extends the last."""
        messages = rec.messages or []
        before = self._sessions.get(session)
        found = 0
        if before is not None and len(messages) >= before[0]:
            found = repeated(messages[before[0] :], before[1])
        gone = _NONE if before is None else before[1]
        if before is None or changed:
            view = rec.outcome.messages if rec.outcome is not None else None
            gone = _NONE if view is None else dropped(messages, view)
        self._sessions[session] = (len(messages), gone)
        if found:
            self.calls.inc(found)
        return found

    def forget(self, session: str) -> None:
        self._sessions.pop(session, None)
