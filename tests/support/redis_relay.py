"""A TCP relay in front of a real Redis that counts round trips.

A round trip is the client speaking after the server last answered (or first):
pipelined commands leave in one burst and count once, as they cost one wait.
Listens on 127.0.0.1 only, in a thread of its own, until ``close``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class CountingRelay:
    def __init__(self, redis_port: int) -> None:
        self._redis_port = redis_port
        self._lock = threading.Lock()
        self._trips = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def trips(self) -> int:
        with self._lock:
            return self._trips

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stopping.wait()
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", self._redis_port)
        waiting = [False]  # the client has spoken and not yet been answered

        def spoke() -> None:
            if not waiting[0]:
                waiting[0] = True
                with self._lock:
                    self._trips += 1

        def answered() -> None:
            waiting[0] = False

        await asyncio.gather(
            _pipe(client_r, redis_w, spoke),
            _pipe(redis_r, client_w, answered),
            return_exceptions=True,
        )


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Callable[[], None]
) -> None:
    try:
        while data := await reader.read(65536):
            seen()
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


__all__: list[str] = ["CountingRelay"]
