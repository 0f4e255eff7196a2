"""`compaction-proxy serve` as a real process, its log kept, and a slow stream through it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.multiprocess import MultiProcessCollector

from tests.support.starting import start_listening

# tiktoken caches under the temporary directory by default: the same cache as ours,
# whatever TMPDIR the process gets.
_TIKTOKEN_CACHE = os.environ.get("TIKTOKEN_CACHE_DIR") or os.path.join(
    tempfile.gettempdir(), "data-gym-cache"
)
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    tmp: Path  # the process's TMPDIR (where a supervisor makes its metrics directory)
    config_path: Path  # the YAML it was started with (rewrite it to reload its tenants)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """The pids of the process's children (workers), from /proc."""
        pid = self.process.pid
        path = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m proxy ARGS`` run to its end (a minute at most), its output kept as text;
    ``env`` added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def write_config(tmp_path: Path, config: dict[str, Any]) -> str:
    """``config`` as tmp_path/config.yaml (replaced on each call); its path."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@contextmanager
def serve_process(tmp_path: Path, config: dict[str, Any]) -> Iterator[Served]:
    """Start the proxy from ``config``; yields once /healthz answers; killed on exit if alive."""
    name = f"proxy-{len(list(tmp_path.glob('proxy-*.yaml')))}"
    config_path = tmp_path / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / f"{name}.log"
    tmp = tmp_path / f"{name}-tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(config_path)]
    process, port = start_listening(
        lambda port: [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        log_path,
        "/healthz",
        "the proxy",
        env={**os.environ, "TMPDIR": str(tmp), "TIKTOKEN_CACHE_DIR": _TIKTOKEN_CACHE},
    )
    served = Served(f"http://127.0.0.1:{port}", process, log_path, tmp, config_path)
    try:
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@dataclass
class SlowStream:
    """A streamed chat read in a background thread: its SSE ``data:`` lines and how it ended."""

    url: str
    chunk_delay_ms: int
    events: list[str] = field(default_factory=list)
    error: Exception | None = None
    first_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> SlowStream:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.first_event.wait(15), f"no first event: {self.error!r}"
        return self

    def _read(self) -> None:
        headers = {"X-Sim-Chunk-Delay-Ms": str(self.chunk_delay_ms)}
        body = {**CHAT, "stream": True}
        try:
            url = f"{self.url}/v1/chat/completions"
            with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line)
                        self.first_event.set()
        except Exception as exc:
            self.error = exc
        finally:
            self.first_event.set()

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self, timeout: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not end"


def refused(url: str) -> bool:
    """Whether a new connection to ``url`` is refused."""
    try:
        httpx.get(f"{url}/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    except (httpx.RemoteProtocolError, httpx.ReadError):
        # Accepted by the kernel just as the server stopped accepting, then closed: the
        # race a drain delay keeps load balancers out of.
        return False
    return False


def wait_until_refused(url: str, timeout: float) -> float:
    """Seconds until new connections are refused (AssertionError past ``timeout``)."""
    start = time.monotonic()
    while not refused(url):
        assert time.monotonic() - start < timeout, "the proxy still accepts connections"
        time.sleep(0.05)
    return time.monotonic() - start


CHATS = "compaction_proxy_chat_requests"


def chats_by_worker(served: Served) -> dict[int, float]:
    """Each worker's own count, read from its file in the supervisor's metrics directory."""
    counts = {}
    for path in served.tmp.glob("compaction-proxy-metrics-*/counter_*.db"):
        pid = int(path.stem.removeprefix("counter_"))
        counts[pid] = sum(
            sample.value
            for family in MultiProcessCollector.merge([str(path)])
            if family.name == CHATS
            for sample in family.samples
            if sample.name == f"{CHATS}_total"
        )
    return counts
