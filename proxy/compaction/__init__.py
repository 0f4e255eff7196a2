"""Compaction: counting, planning calls, summarizing, snapshots and when to compact."""
