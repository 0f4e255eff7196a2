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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.types import Receive

from proxy.errors import ClientDisconnected


@asynccontextmanager
async def cancelled_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Run the body; if the client disconnects meanwhile, cancel it and raise
    ``ClientDisconnected``. Use only after the request body has been read whole:
    the watcher consumes what ``receive`` returns."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise ClientDisconnected("The client closed the connection.") from None
        raise
    finally:
        watcher.cancel()
