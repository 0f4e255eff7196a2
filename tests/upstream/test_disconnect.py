"""A client that gives up cancels its upstream call (issue 8): the watcher in-process.

Every phase through a real proxy: tests/e2e/test_disconnect_e2e.py.
"""

from __future__ import annotations

from typing import Any


async def test_watching_for_a_disconnect_leaves_no_reference_cycle() -> None:
    """The watcher is cancelled on every request: what it leaves must go by reference
    counting. A cycle through it kept each request's objects (~27) for the collector,
    whose passes cost more than anything else the proxy adds to a request."""
    import asyncio
    import gc

    from proxy.upstream.disconnect import cancelled_on_disconnect

    async def never_disconnects() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def one_request() -> None:
        async with cancelled_on_disconnect(never_disconnects):
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the watcher takes its cancellation

    await one_request()
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            await one_request()
        assert gc.collect() == 0
    finally:
        gc.enable()
