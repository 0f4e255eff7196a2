"""What the simulator saw: recent chat requests, the usage it answered each with
(``usage``, when it answered with one, and ``cache``: why its prompt cache read what it
read), and counters, for ``/_sim/``.

Bodies are kept as the raw bytes that arrived (they already parsed as JSON),
bounded by count and by total size: a benchmark sends thousands of long
conversations, and parsed copies of them would cost several times more memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Literal, get_args

import orjson

Counter = Literal[
    "requests",
    "overflows",
    "summaries",
    "rejected_structure",
    "rejected_output",  # an output budget above the model's output limit (max_tokens_error)
    "failures",
    "streams_abandoned",
    "calls_abandoned",
    "slot_waits",  # requests that queued for a slot (config.slots)
    "prompt_tokens_read",  # chat prompt tokens a slot read, not from its cache (a sum)
    "compactions",  # compaction items written (compaction_trigger, /responses/compact...)
]
COUNTERS: tuple[Counter, ...] = get_args(Counter)


class Recorder:
    """The last chat requests (a headers subset and the body) and the counters."""

    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self._max_requests = max_requests
        self._max_bytes = max_bytes
        self._entries: deque[tuple[int, bytes]] = deque()
        self._usage: dict[int, bytes] = {}  # by entry number: the usage it was answered with
        self._numbered = 0
        self._bytes = 0
        self._stats: dict[Counter, int] = dict.fromkeys(COUNTERS, 0)

    def record(self, headers: Mapping[str, str], raw_body: bytes) -> int:
        """Keep one request; ``raw_body`` must be valid JSON (it is spliced in as is).
        Its number, for ``answered``."""
        self._numbered += 1
        if self._max_requests <= 0:
            return self._numbered
        # authorization and every x-* header (x-session-id, x-compaction-purpose,
        # x-sim-*, x-api-key) and anthropic-* header (anthropic-version, anthropic-beta):
        # what tests assert on; the rest is transport noise.
        kept = {
            key: value
            for key, value in headers.items()
            if key == "authorization" or key.startswith(("x-", "anthropic-"))
        }
        entry = b'{"headers":' + orjson.dumps(kept) + b',"body":' + raw_body + b"}"
        self._entries.append((self._numbered, entry))
        self._bytes += len(entry)
        while self._entries and (
            len(self._entries) > self._max_requests or self._bytes > self._max_bytes
        ):
            number, dropped = self._entries.popleft()
            self._bytes -= len(dropped)
            self._usage.pop(number, None)
        return self._numbered

    def answered(self, number: int, usage: Mapping[str, object], cache: str | None = None) -> None:
        """The usage request ``number`` (``record``'s) was answered with, and its prompt
        cache's outcome (core/cache_outcome.py; None: not cached), its billing record."""
        if self._entries and self._entries[0][0] <= number:
            billed = b',"usage":' + orjson.dumps(usage) + b',"cache":' + orjson.dumps(cache)
            self._usage[number] = billed

    def bump(self, counter: Counter, by: int = 1) -> None:
        self._stats[counter] += by

    def requests_json(self) -> bytes:
        """The recorded requests, oldest first, as one JSON array."""
        return b"[" + b",".join(self._with_usage(n, e) for n, e in self._entries) + b"]"

    def _with_usage(self, number: int, entry: bytes) -> bytes:
        usage = self._usage.get(number)
        return entry if usage is None else entry[:-1] + usage + b"}"

    def stats(self) -> dict[str, int]:
        return {str(name): count for name, count in self._stats.items()}

    def clear(self) -> None:
        """Forget recorded requests and zero the counters."""
        self._entries.clear()
        self._usage.clear()
        self._bytes = 0
        self._stats = dict.fromkeys(COUNTERS, 0)
