"""A stored snapshot of a given version, for the store tests."""

from __future__ import annotations

from proxy.store import Snapshot


def snap(version: int, summary: str = "") -> Snapshot:
    return Snapshot(
        version=version,
        summary=summary or f"summary v{version}",
        pinned=1,
        covered=10 * version,
        elide_before=1,
        anchor_hash=f"hash-{version}",
        summary_tokens=50,
        tokens_before=4000,
        tokens_after=2000,
        created_at=1_700_000_000.0,
        updated_at=1_700_000_000.0 + version,
        model="gpt-4o",
    )
