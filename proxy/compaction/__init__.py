"""Compaction: counting a history, loading snapshots, summarizing under the session's lock,
and deciding when to compact (and the request-body budget, inflight)."""
