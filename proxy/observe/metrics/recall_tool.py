"""The recall tool as series (compaction/recall_tool.py moves them): what became of the
turns it was offered to and the calls it answered, and the tokens of the answers it
consumed that the client never sees."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

OUTCOMES = ("offered", "answered", "mixed", "exhausted", "refused", "unread", "client_tool")


@dataclass(frozen=True, slots=True)
class RecallToolSeries:
    outcomes: Counter
    tokens: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> RecallToolSeries:
        series = cls(
            outcomes=Counter(
                "compaction_proxy_recall_tool",
                "The recall tool, by outcome (offered: added to a request; answered: a call "
                "the proxy answered, then asked the upstream again; mixed: an answer that "
                "also called the client's tools, asked again without the recall tool; "
                "exhausted: rounds or room used up, asked again with tool_choice none; "
                "refused: still called after that, a 502; unread: an answer too big or "
                "encoded to read, relayed as it came; client_tool: the client declares a "
                "tool of the same name, nothing added)",
                ["outcome"],
                registry=registry,
            ),
            tokens=Counter(
                "compaction_proxy_recall_tool_tokens",
                "Prompt tokens of the upstream answers the recall tool consumed (the client "
                "sees only the last answer's usage), as the upstream stated them",
                registry=registry,
            ),
        )
        for outcome in OUTCOMES:  # zeros from start-up: a closed set
            series.outcomes.labels(outcome=outcome)
        return series
