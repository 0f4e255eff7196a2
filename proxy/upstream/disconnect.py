"""Noticing a client that went away while its upstream call is in flight.

A streamed answer notices a disconnect by itself once it relays bytes (the
ASGI server fails the send and Starlette cancels the stream). Before that,
while the upstream is still thinking (a non-streamed answer, or a stream
whose headers have not come yet), nothing reads from the client, so nothing
would notice: the upstream would go on generating, and billing, for no one.
``cancelled_on_disconnect`` watches the client for that span and cancels the
work, which closes the upstream connection and so stops the upstream.

Given when the request's body was in, the watcher starts ``WATCH_AFTER_S`` after
that, not at once: a request sent upstream that soon (no summary first) whose
answer is in by then (every one at saturation on loopback, bench/README.md "Where
the time goes") costs an entry in a dict, not a task started and cancelled (nor a
timer of its own: uvloop's cost about half a task's). One ``_Sweeper`` per event loop
starts the watchers that are due, every ``WATCH_AFTER_S / 2`` while any wait. A request that
took longer to get there (a summary first: its client may have left meanwhile) is
watched at once, and a client gone before the watcher starts is noticed when it
does (its first ``receive`` says so at once).
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from types import TracebackType

from starlette.types import Receive

from proxy.errors import ClientDisconnected

# After the body, when the watcher starts: far below a model's answer time (a client gone
# costs at most this much of an upstream call), above what a loopback upstream's answer
# waits for its turn on a saturated event loop (64 connections: 20-40 ms in all, p50).
WATCH_AFTER_S = 0.05


class _Sweeper:
    """One event loop's requests waiting for their watcher (by deadline), and the one
    timer that starts the watchers due; it runs only while some request waits."""

    __slots__ = ("_timer", "loop", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[cancelled_on_disconnect, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, entry: cancelled_on_disconnect, deadline: float) -> None:
        self.waiting[entry] = deadline
        if self._timer is None:
            self._timer = self.loop.call_later(WATCH_AFTER_S / 2, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = perf_counter()
        for entry in [e for e, deadline in self.waiting.items() if deadline <= now]:
            entry.now()
        if self.waiting:
            self._timer = self.loop.call_later(WATCH_AFTER_S / 2, self._sweep)


class _Sweepers:
    current: _Sweeper | None = None  # the running loop's (one loop a process, but tests')


def _sweeper(loop: asyncio.AbstractEventLoop) -> _Sweeper:
    sweeper = _Sweepers.current
    if sweeper is None or sweeper.loop is not loop:
        # Another loop's goes on sweeping from its own timer while it has entries.
        sweeper = _Sweepers.current = _Sweeper(loop)
    return sweeper


class cancelled_on_disconnect:  # lower case: used where a function was, like one
    """``with cancelled_on_disconnect(receive):`` (or ``async with``), in a task, runs the
    body; if the client disconnects meanwhile, cancels it and raises
    ``ClientDisconnected``. Use only after
    the request body has been read whole: the watcher consumes what ``receive`` returns.
    ``since``: when the request's body was in (``perf_counter``); None or 0 watches at once.
    ``loop``: the event loop the calling task runs on, when the caller knows it (the one the
    app was built in): ``current_task`` given its loop skips ``get_running_loop``'s pid check,
    a ``getpid`` system call a request on Python 3.11 (as ``Deadlines.start``); a loop with
    no task running finds the task without it.

    A class, not an ``asynccontextmanager``: its generator machinery cost more than the
    rest of entering and leaving, once per request; and a plain context manager, since
    entering and leaving never wait (two coroutines less a request).
    """

    __slots__ = ("_gone", "_loop", "_receive", "_since", "_sweeper", "_task", "_watcher")

    def __init__(
        self,
        receive: Receive,
        since: float | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._receive = receive
        self._since = since
        self._loop = loop
        self._gone = False
        self._sweeper: _Sweeper | None = None  # while waiting for the watcher
        self._watcher: asyncio.Task[None] | None = None

    def __enter__(self) -> cancelled_on_disconnect:
        task = asyncio.current_task(self._loop) or asyncio.current_task()
        assert task is not None
        self._task = task
        # Soon, not at once, yet well before what follows a slow call (an overflow's
        # recovery may summarize, then call the upstream again) could run unwatched.
        since = self._since
        if since and perf_counter() - since < WATCH_AFTER_S:
            self._sweeper = _sweeper(task.get_loop())
            self._sweeper.add(self, since + WATCH_AFTER_S)
        else:
            self._start()
        return self

    def now(self) -> None:
        """Watch from now on, if not yet: what follows may take long (a recovery)."""
        if self._sweeper is not None:
            self._sweeper.waiting.pop(self, None)
            self._sweeper = None
            self._start()

    def _start(self) -> None:
        self._watcher = self._task.get_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        self._task.cancel()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:  # never swallows what the body raised
        if self._sweeper is not None:  # done before the watcher started: nothing to stop
            self._sweeper.waiting.pop(self, None)
            self._sweeper = None
        if self._watcher is not None:
            self._watcher.cancel()
            # The watcher's CancelledError will hold its frame, which holds us: without
            # this edge back to the watcher, that is no reference cycle, and the request's
            # objects go by reference counting, not by the garbage collector (tens of us
            # of collection a request when they waited for it: bench/README.md).
            self._watcher = None
        cancelled = kind is not None and issubclass(kind, asyncio.CancelledError)
        if cancelled and self._gone and self._task.uncancel() == 0:
            raise ClientDisconnected("The client closed the connection.") from None

    async def __aenter__(self) -> cancelled_on_disconnect:
        return self.__enter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.__exit__(kind, exc, traceback)
