"""Noticing a client that went away while its upstream call is in flight.

A streamed answer notices a disconnect by itself once it relays bytes (the
ASGI server fails the send and Starlette cancels the stream). Before that,
while the upstream is still thinking (a non-streamed answer, or a stream
whose headers have not come yet), nothing reads from the client, so nothing
would notice: the upstream would go on generating, and billing, for no one.
``cancelled_on_disconnect`` watches the client for that span and cancels the
work, which closes the upstream connection and so stops the upstream.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from starlette.types import Receive

from proxy.errors import ClientDisconnected


class cancelled_on_disconnect:  # lower case: used where a function was, like one
    """``async with cancelled_on_disconnect(receive):`` runs the body; if the client
    disconnects meanwhile, cancels it and raises ``ClientDisconnected``. Use only after
    the request body has been read whole: the watcher consumes what ``receive`` returns.

    A class, not an ``asynccontextmanager``: its generator machinery cost more than the
    rest of entering and leaving, once per request.
    """

    __slots__ = ("_gone", "_receive", "_task", "_watcher")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._gone = False
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        # At once: a client gone even a few ms into the call must stop what follows
        # (an overflow's recovery may summarize, then call the upstream again).
        self._watcher = task.get_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        self._task.cancel()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:  # never swallows what the body raised
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
