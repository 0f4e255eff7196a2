"""The archive of originals and recall by excerpts as series: what
compactions archived, what the bounds dropped, what recall searched and brought back.
``compaction/archive.py`` and ``compaction/recall.py`` move them."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True, slots=True)
class ArchiveSeries:
    writes: Counter
    messages: Counter
    dropped_bytes: Counter
    recalls: Counter
    recalled_excerpts: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ArchiveSeries:
        series = cls(
            writes=Counter(
                "compaction_proxy_archive_writes",
                "Writes of originals to the archive (a compaction's newly covered span, a "
                "trimmed view's newly dropped turns), by outcome (archived; failed: the turn "
                "was served without them archived; skipped: too many writes under way)",
                ["outcome"],
                registry=registry,
            ),
            messages=Counter(
                "compaction_proxy_archived_messages",
                "Messages written to the archive of originals",
                registry=registry,
            ),
            dropped_bytes=Counter(
                "compaction_proxy_archive_dropped_bytes",
                "Bytes of archived originals dropped, oldest first, to keep within a bound "
                "(session: a session's archive; tenant: a tenant's over all its sessions)",
                ["bound"],
                registry=registry,
            ),
            recalls=Counter(
                "compaction_proxy_recalls",
                "Compacted views searched for excerpts of archived originals, by outcome "
                "(recalled: excerpts added; none: nothing relevant; no_room: relevant but "
                "no room in the window or no newest user message after the summary)",
                ["outcome"],
                registry=registry,
            ),
            recalled_excerpts=Counter(
                "compaction_proxy_recalled_excerpts",
                "Excerpts of archived originals put before the newest user message",
                registry=registry,
            ),
        )
        for outcome in ("archived", "failed", "skipped"):  # zeros from start-up: a closed set each
            series.writes.labels(outcome=outcome)
        for bound in ("session", "tenant"):
            series.dropped_bytes.labels(bound=bound)
        for outcome in ("recalled", "none", "no_room"):
            series.recalls.labels(outcome=outcome)
        return series
