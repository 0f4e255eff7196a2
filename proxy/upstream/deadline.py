"""``upstream.total_timeout_s``: one upstream call, streams included, has a deadline (an
upstream dripping a byte per ``timeout_s`` cannot hold a request for ever).

aiohttp's own ``total`` timeout arms an event-loop timer per request and wraps every read
in a context that notes the current task: a few µs a request at saturation (bench/README.md,
"Where the time goes (issue 27)"). The deadline is a bound of minutes (30 by default), not
a precise instant, so ``Deadlines`` keeps every call's in one dict and checks them from one
timer per client, every ``tick`` (an eighth of the total, 10 ms to 1 s): a call ends at most
one tick past its deadline. A call that times out before its answer's head is cancelled (the
task waiting for it gets ``CancelledError``, which ``UpstreamClient.send`` turns into a
timeout, as aiohttp's ``total`` would); once the head is in, its response is closed, which
ends a read under way with an error the response turns into a timed-out body.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class _Closable(Protocol):
    def close(self) -> None: ...


class Deadline:
    """One upstream call's: the task waiting for its head, then its response."""

    __slots__ = ("expired", "response", "task")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.response: _Closable | None = None
        self.expired = False

    def expire(self) -> None:
        self.expired = True
        if self.response is not None:
            self.response.close()
        elif self.task is not None:
            self.task.cancel()


class Deadlines:
    """The deadlines of one client's calls under way; built inside its event loop."""

    __slots__ = ("_due", "_loop", "_tick", "_timer", "_total")

    def __init__(self, total_s: float) -> None:
        self._total = total_s
        self._tick = min(max(total_s / 8, 0.01), 1.0)
        self._loop = asyncio.get_running_loop()
        self._due: dict[Deadline, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> Deadline:
        """The deadline of a call the current task starts now; ``end`` it when done."""
        # Given its loop, current_task skips get_running_loop's pid check (a getpid system
        # call a request on Python 3.11: bench/syscalls_per_request.py).
        deadline = Deadline(asyncio.current_task(self._loop))
        self._due[deadline] = self._loop.time() + self._total
        if self._timer is None:
            self._timer = self._loop.call_later(self._tick, self._sweep)
        return deadline

    def end(self, deadline: Deadline) -> None:
        self._due.pop(deadline, None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sweep(self) -> None:
        now = self._loop.time()
        for deadline in [d for d, due in self._due.items() if due <= now]:
            del self._due[deadline]
            deadline.expire()
        self._timer = self._loop.call_later(self._tick, self._sweep) if self._due else None
