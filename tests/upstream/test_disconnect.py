"""A client that gives up cancels its upstream call (issue 8): the watcher in-process.

Every phase through a real proxy: tests/e2e/test_disconnect_e2e.py.
"""

from __future__ import annotations

from typing import Any

from proxy.upstream.disconnect import WATCH_AFTER_S


async def test_watching_for_a_disconnect_leaves_no_reference_cycle() -> None:
    """The watcher is cancelled on every request: what it leaves must go by reference
    counting. A cycle through it kept each request's objects (~27) for the collector,
    whose passes cost more than anything else the proxy adds to a request."""
    import asyncio
    import gc
    import time

    from proxy.upstream.disconnect import cancelled_on_disconnect

    async def never_disconnects() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def one_request(upstream_s: float) -> None:
        async with cancelled_on_disconnect(never_disconnects, time.perf_counter()):
            await asyncio.sleep(upstream_s)
        await asyncio.sleep(0)  # the watcher takes its cancellation

    # Answered before the watcher starts (its timer cancelled), and after (it cancelled).
    for upstream_s in (0.0, 2 * WATCH_AFTER_S):
        await one_request(upstream_s)
        gc.collect()
        gc.disable()
        try:
            for _ in range(5):
                await one_request(upstream_s)
            assert gc.collect() == 0, upstream_s
        finally:
            gc.enable()


async def test_a_quick_answer_starts_no_watcher() -> None:
    """An answer in before ``WATCH_AFTER_S`` (a loopback upstream's, at saturation) costs
    a timer: no task that reads from the client is started, then cancelled."""
    import asyncio
    import time

    from proxy.upstream.disconnect import cancelled_on_disconnect

    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    for _ in range(3):
        async with cancelled_on_disconnect(receive, time.perf_counter()):
            await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert reads == 0
    async with cancelled_on_disconnect(receive, time.perf_counter()):  # a slow one is watched
        await asyncio.sleep(3 * WATCH_AFTER_S)
    assert reads == 1
    # A request that took its time to get here (a summary first) is watched at once.
    async with cancelled_on_disconnect(receive, time.perf_counter() - WATCH_AFTER_S):
        await asyncio.sleep(0)
    assert reads == 2
    async with cancelled_on_disconnect(receive, time.perf_counter()) as watch:
        watch.now()  # so is one about to recover from an overflow
        await asyncio.sleep(0)
    assert reads == 3


async def test_a_client_gone_from_the_start_is_noticed_once_watched() -> None:
    import asyncio
    import time

    import pytest

    from proxy.errors import ClientDisconnected
    from proxy.upstream.disconnect import cancelled_on_disconnect

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    for since in (time.perf_counter(), None):  # watched soon, or at once
        started = time.monotonic()
        with pytest.raises(ClientDisconnected):
            async with cancelled_on_disconnect(gone, since):
                await asyncio.sleep(5)  # the upstream, thinking
        assert time.monotonic() - started < 1


async def test_given_its_loop_the_task_is_found_without_the_running_loop(monkeypatch: Any) -> None:
    """``current_task()`` asks ``get_running_loop``, whose pid check is a ``getpid`` system
    call on Python 3.11; given the loop the app was built in, the watcher asks that loop's
    task. A loop running no task (not the caller's) still finds the caller's, and watches."""
    import asyncio
    import time

    import pytest

    from proxy.errors import ClientDisconnected
    from proxy.upstream.disconnect import cancelled_on_disconnect

    asked: list[object] = []
    real = asyncio.current_task

    def current_task(loop: asyncio.AbstractEventLoop | None = None) -> Any:
        asked.append(loop)
        return real(loop)

    monkeypatch.setattr(asyncio, "current_task", current_task)

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    loop = asyncio.get_running_loop()
    for since in (time.perf_counter(), None, 0.0):  # soon; at once; at once (never read)
        asked.clear()
        with pytest.raises(ClientDisconnected):
            async with cancelled_on_disconnect(gone, since, loop):
                await asyncio.sleep(5)
        assert asked == [loop], since
    other = asyncio.new_event_loop()
    try:
        asked.clear()
        with pytest.raises(ClientDisconnected):
            async with cancelled_on_disconnect(gone, time.perf_counter(), other):
                await asyncio.sleep(5)
        assert asked == [other, None]
    finally:
        other.close()
