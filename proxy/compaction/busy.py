"""The proxy's own summaries in flight (background ones, and inline ones under a turn's
deadline: turn_deadline.py), by the model they call: what a turn sent meanwhile may
queue behind.

A server with one slot (llama.cpp's ``-np 1``, common for self-hosted models) answers
one request at a time: a turn sent while a summary on the same model runs waits for it
upstream (tens of seconds on a CPU: bench/README.md), which none of the proxy's own
waits shows. ``pipeline.forward`` counts such turns
(``compaction_proxy_turns_sent_during_summary_total``) and marks their answers
``X-Compaction-Degraded: summary_busy`` (precompact.py ``note_sent``); whether they
waited depends on the server's slots, so this is a risk, not a measured wait. Per
process: another replica's summaries are not seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class BusyModels:
    """Event loop only: no lock."""

    running: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def summarizing(self, model: str) -> Iterator[None]:
        """Around one background summary's calls to ``model``."""
        self.running[model] = self.running.get(model, 0) + 1
        try:
            yield
        finally:
            left = self.running[model] - 1
            if left:
                self.running[model] = left
            else:
                del self.running[model]

    def busy(self, model: str) -> bool:
        """Whether a background summary on ``model`` is running now. O(1)."""
        return model in self.running
