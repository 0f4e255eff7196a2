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
process: another replica's summaries are not seen. A summary leaves the model as soon as
its calls have ended (``Lease.end``, from fold.py), before its snapshot is saved.

On a model known to have one slot (``models[].slots: 1``, or llama.cpp's ``/props``) a
background summary gives way instead: a turn sent to it cancels the summary (the
upstream stops generating once its caller is gone, as llama.cpp does), so the turn
waits for no summary, and the summary is offered again later (precompact.py counts it
``yielded``). Background summaries so run only while no turn arrives. Once its calls
have ended it no longer gives way: a finished summary is saved, not thrown away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

Task = asyncio.Task[Any]


@dataclass(slots=True)
class Lease:
    """One summary's hold on its model, ended once (``end`` is idempotent)."""

    busy: BusyModels
    model: str
    task: Task | None  # the task a turn cancels; None: it does not give way
    ended: bool = False

    def end(self) -> None:
        """The summary's calls are over: it no longer occupies (nor yields) the model."""
        if self.ended:
            return
        self.ended = True
        busy, model = self.busy, self.model
        left = busy.running[model] - 1
        if left:
            busy.running[model] = left
        else:
            del busy.running[model]
        waiting = busy.yielding.get(model)
        if self.task is not None and waiting is not None:
            waiting.discard(self.task)
            if not waiting:
                del busy.yielding[model]


@dataclass(slots=True)
class BusyModels:
    """Event loop only: no lock."""

    running: dict[str, int] = field(default_factory=dict)
    # Per model, the tasks of the summaries that give way to a turn (give_way), those
    # cancelled already included until they have left.
    yielding: dict[str, set[Task]] = field(default_factory=dict)
    # Tasks cancelled by give_way, until their run is counted (Precompactor._done).
    gave_way: set[Task] = field(default_factory=set)

    @contextmanager
    def summarizing(self, model: str, *, yields: bool = False) -> Iterator[Lease]:
        """Around one summary's calls to ``model``; ``yields``: the task running it is
        cancelled by a turn sent to ``model`` meanwhile (give_way)."""
        self.running[model] = self.running.get(model, 0) + 1
        task = asyncio.current_task() if yields else None
        if task is not None:
            self.yielding.setdefault(model, set()).add(task)
        lease = Lease(self, model, task)
        try:
            yield lease
        finally:
            lease.end()

    def busy(self, model: str) -> bool:
        """Whether a summary of the proxy's own on ``model`` is running now. O(1)."""
        return model in self.running

    def give_way(self, model: str) -> bool:
        """Cancel the summaries on ``model`` that give way to a turn; whether a summary
        that does not (an inline one) still runs there. O(summaries on it)."""
        tasks = self.yielding.get(model, set())
        for task in tasks:
            if task not in self.gave_way and task.cancel():
                self.gave_way.add(task)
        return self.running.get(model, 0) > len(tasks)
