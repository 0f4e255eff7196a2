"""A loopback TCP relay that keeps a copy of what the proxy sends its upstream and gets back.

``run.py --capture`` puts one between each proxy run and llama-server, so a missed fact can
be traced to the prompt the model saw (was the fact in an excerpt, in the summary, in the
view at all?). It relays bytes, not HTTP: a connection the proxy closes (a summary it gave
up on) is closed towards llama-server too, as without the relay, and timing is unchanged
but for a copy in memory. Each connection's two directions are written as they are, to
``PREFIX-cN.req`` and ``PREFIX-cN.resp``; ``messages`` reads the requests back.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

_CHUNK = 65536


def _pump(src: socket.socket, dst: socket.socket, out: Path) -> None:
    with out.open("ab", buffering=0) as copy:
        try:
            while data := src.recv(_CHUNK):
                copy.write(data)
                dst.sendall(data)
        except OSError:
            pass
    for sock in (dst, src):
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def relay(upstream_port: int, prefix: Path) -> Iterator[int]:
    """Listen on a free loopback port, relay each connection to ``upstream_port``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()
    sockets: list[socket.socket] = []

    def accept() -> None:
        n = 0
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            n += 1
            try:
                server = socket.create_connection(("127.0.0.1", upstream_port), timeout=30)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            sockets.extend((client, server))
            for src, dst, ext in ((client, server, "req"), (server, client, "resp")):
                out = prefix.with_name(f"{prefix.name}-c{n}.{ext}")
                threading.Thread(target=_pump, args=(src, dst, out), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()
        for sock in sockets:
            with suppress(OSError):
                sock.close()


_HEAD = re.compile(rb"(POST|GET|PUT|DELETE|HEAD|OPTIONS|PATCH) (\S+) HTTP/1\.[01]\r\n")


def requests(path: Path) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """The HTTP requests in one ``.req`` copy: (target, JSON body or None)."""
    data = path.read_bytes()
    pos = 0
    while (m := _HEAD.search(data, pos)) is not None:
        end = data.find(b"\r\n\r\n", m.end())
        if end < 0:
            return
        head = data[m.end() : end].decode("latin-1").lower()
        length = re.search(r"content-length:\s*(\d+)", head)
        n = int(length.group(1)) if length else 0
        body = data[end + 4 : end + 4 + n]
        pos = end + 4 + n
        try:
            yield m.group(2).decode(), json.loads(body) if body else None
        except ValueError:
            yield m.group(2).decode(), None


def messages(prefix: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every chat request the proxy sent through the relay at ``prefix``: (file, body)."""
    for path in sorted(prefix.parent.glob(f"{prefix.name}-c*.req")):
        for target, body in requests(path):
            if body is not None and "messages" in body:
                yield f"{path.name} {target}", body
