"""Where a warm turn's time goes, in process: CPU per pipeline step (issue 27, item 3).

    python bench/warm_profile.py [--requests 1000] [--payload big100k|chat20]
                                 [--store-url redis://127.0.0.1:P/0] [--cprofile out.prof]
                                 [--recall on|off|both]

Starts ``fake_upstream.py`` (a subprocess on a free 127.0.0.1 port), builds the proxy's app
in this process as ``proxy-compacting`` configures it (a 120k window for ``big100k``, so the
session compacts; 1M for ``chat20``, which then passes through), and sends the body to the
app through ASGI directly, no client socket: a few requests to compact and warm up, then
``--requests`` timed ones, each with ``X-Session-Id: bench-warm-100k`` for ``big100k``. The
collector is set up as the server sets it (``gc.freeze``, ``GC_THRESHOLD``). Every step is
timed by a wrapper with ``time.thread_time_ns`` (CPU time of this thread: another process on
the core does not count), and the table gives each step's median over the timed requests.
``--cprofile`` writes a cProfile of the timed requests instead of timing the steps.
``--recall both`` runs two apps in the same process, one with ``compaction.recall`` on and
one with it off, each its own session, their requests alternating, and reports each one's
median and the difference (what excerpts cost a warm turn); the steps' table is then the
recall-on app's. Each request's newest message is one of ``VARIANTS`` wordings, so each
is a new turn to recall (both apps alike).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import inspect
import logging
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop
from payloads import build_payload
from targets import COMPACTING_WINDOW, FORWARDING_WINDOW, free_port

import proxy.compaction.count as count_module
import proxy.compaction.prepare as prepare_module
import proxy.compaction.recall as recall_module
import proxy.core.ranking as ranking_module
import proxy.observe.recorder as recorder_module
import proxy.pipeline as pipeline_module
import proxy.routes.chat as chat_module
import proxy.routes.parse as parse_module
from proxy.app import create_app
from proxy.config import load_settings
from proxy.serve.server import GC_THRESHOLD

BENCH = Path(__file__).resolve().parent
SESSION = b"bench-warm-100k"
# More newest-message wordings than recall keeps blocks for (recall.BLOCKS): every request
# searches, as a new turn does (a tool loop's requests would reuse the block).
VARIANTS = 97
# (module, attribute, label): the steps timed, in the order the table lists them.
STEPS: tuple[tuple[Any, str, str], ...] = (
    (pipeline_module, "read_body", "read the body"),
    (chat_module, "parse_chat_request", "parse (all)"),
    (parse_module, "load_request", "  orjson.loads"),
    (parse_module, "check_depth", "  depth check (orjson.dumps)"),
    (prepare_module, "count_history", "count_history (all)"),
    (count_module, "digests_and_sizes", "  digests"),
    (count_module, "result_flags", "  result flags"),
    (count_module, "_count", "  token counts (cached)"),
    (prepare_module, "session_of", "session_of"),
    (prepare_module, "load_session", "load_session (store, anchor)"),
    (pipeline_module, "plan_compaction", "plan_compaction"),
    (pipeline_module, "rebuild_outcome", "rebuild_outcome"),
    (recall_module.Recall, "excerpts", "recall excerpts (all)"),
    (recall_module, "query_terms", "  query terms"),
    (ranking_module.Ranking, "search", "  search (BM25)"),
    (recall_module, "render_excerpts", "  render the block"),
    (pipeline_module, "compacted_view", "compacted_view (all)"),
    (pipeline_module, "forward", "forward (view body, upstream)"),
    (recorder_module.Recorder, "finish", "request record and ledger"),
)


def _timed(samples: dict[str, list[int]], label: str, fn: Callable[..., Any]) -> Any:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return await fn(*args, **kwargs)
            finally:
                samples[label].append(time.thread_time_ns() - start)

        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            samples[label].append(time.thread_time_ns() - start)

    return timed


class InProcess:
    """The app, its lifespan and one request through ASGI."""

    def __init__(self, app: Any, body: bytes, session: bytes, variants: int = 1) -> None:
        self.app, self.body, self.state = app, body, {}
        # The same history, its newest message in ``variants`` wordings taken in turn: a
        # new turn each request for what keys on it (recall's block of excerpts).
        self.bodies = [body] if variants == 1 else [_variant(body, i) for i in range(variants)]
        self._next = 0
        self.headers = [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer sk-bench"),
            (b"content-length", str(len(body)).encode()),
        ] + ([(b"x-session-id", session)] if session else [])
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lifespan: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        self._lifespan = asyncio.create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        started = await self._from_app.get()
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {started}")

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await self._from_app.get()

    async def request(self) -> dict[bytes, bytes]:
        """One POST /v1/chat/completions; the answer's headers."""
        path = b"/v1/chat/completions"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path.decode(),
            "raw_path": path,
            "query_string": b"",
            "headers": self.headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "state": dict(self.state),
        }
        body = self.bodies[self._next % len(self.bodies)]
        self._next += 1
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        headers: dict[bytes, bytes] = {}

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)  # the client stays: no disconnect
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers.update(message["headers"])

        await self.app(scope, receive, send)
        return headers


def _variant(body: bytes, n: int) -> bytes:
    data = orjson.loads(body)
    data["messages"][-1]["content"] += f" (take {n})"
    if RELEVANT:  # a short question about a fact of an early (archived) turn: excerpts
        data["messages"][-1]["content"] = f"{QUESTION} (take {n})"
    return orjson.dumps(data)


def _planted(body: bytes) -> bytes:
    data = orjson.loads(body)
    data["messages"][3]["content"] += f" {FACT}"
    return orjson.dumps(data)


# ``--relevant``: a fact planted early in the history and a question about it in every
# request's newest message, so recall finds it and each request carries a block.
RELEVANT = False
FACT = "The deployment codename is zephyr-4471; the vendor_contact is rhea.okafor."
QUESTION = "Which deployment codename did we pick, and who is the vendor_contact?"


def _config(upstream_port: int, window: int, store_url: str, recall: bool) -> Path:
    config = Path(tempfile.mkdtemp(prefix="warm-profile-")) / "proxy.yaml"
    config.write_text(
        f'upstream: {{base_url: "http://127.0.0.1:{upstream_port}/v1", api_key: "sk-bench"}}\n'
        f'store: {{url: "{store_url}"}}\n'
        f"default_model: {{context_window: {window}, max_output_tokens: 4096}}\n"
        f"compaction: {{recall_budget_ratio: {0.1 if recall else 0}}}\n"
    )
    return config


async def _profile(args: argparse.Namespace, upstream_port: int) -> None:
    big = args.payload == "big100k"
    window = COMPACTING_WINDOW if big else FORWARDING_WINDOW
    modes = {"on": (True,), "off": (False,), "both": (True, False)}[args.recall]
    samples: dict[str, list[int]] = defaultdict(list)
    if not args.cprofile:
        for module, name, label in STEPS:
            setattr(module, name, _timed(samples, label, getattr(module, name)))
    clients = {}
    for recall in modes:
        settings = load_settings(_config(upstream_port, window, args.store_url, recall))
        session = SESSION + (b"-recall" if recall else b"-plain")
        body = build_payload(args.payload)
        body = _planted(body) if RELEVANT else body
        clients[recall] = InProcess(create_app(settings), body, session, VARIANTS)
    for client in clients.values():
        await client.start()
    try:
        for recall, client in clients.items():
            answers = [await client.request() for _ in range(30)]
            first, last = answers[0], answers[-1]
            print(
                f"warm-up (recall {'on' if recall else 'off'}): X-Compaction-Status"
                f" {first.get(b'x-compaction-status')!r} then {last.get(b'x-compaction-status')!r},"
                f" X-Compaction-Recalled {last.get(b'x-compaction-recalled')!r}"
            )
        gc.collect()
        gc.freeze()  # as serve_process and the server's start-up do
        gc.set_threshold(GC_THRESHOLD)
        profile = cProfile.Profile() if args.cprofile else None
        totals: dict[bool, list[int]] = {recall: [] for recall in clients}
        kept: dict[str, list[int]] = defaultdict(list)
        for _ in range(args.requests):
            for recall, client in clients.items():
                samples.clear()
                if profile is not None:
                    profile.enable()
                start = time.thread_time_ns()
                await client.request()
                totals[recall].append(time.thread_time_ns() - start)
                if profile is not None:
                    profile.disable()
                if recall == modes[0]:
                    for label, values in samples.items():
                        kept[label].extend(values)
    finally:
        for client in clients.values():
            await client.stop()
    if profile is not None:
        profile.dump_stats(args.cprofile)
        print(f"wrote {args.cprofile}")
    _table(totals[modes[0]], kept)
    if len(modes) == 2:
        on, off = statistics.median(totals[True]) / 1e3, statistics.median(totals[False]) / 1e3
        print(
            f"median µs CPU a request: recall on {on:.1f}, off {off:.1f}, on - off {on - off:+.1f}"
        )


def _table(totals: list[int], samples: dict[str, list[int]]) -> None:
    print(f"{'step':34s} {'median µs CPU':>14s}")
    print(f"{'the whole request':34s} {statistics.median(totals) / 1e3:14.1f}")
    for _, _, label in STEPS:
        if samples.get(label):
            print(f"{label:34s} {statistics.median(samples[label]) / 1e3:14.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--payload", choices=("big100k", "chat20"), default="big100k")
    parser.add_argument("--store-url", default="memory://")
    parser.add_argument("--cprofile", help="write a cProfile of the timed requests here")
    parser.add_argument("--recall", choices=("on", "off", "both"), default="on")
    parser.add_argument(
        "--relevant",
        action="store_true",
        help="every request asks about a fact of an archived turn: a block of excerpts each",
    )
    args = parser.parse_args()
    global RELEVANT
    RELEVANT = args.relevant
    logging.disable(logging.INFO)
    port = free_port()
    script = str(BENCH / "fake_upstream.py")
    upstream = subprocess.Popen([sys.executable, script, "--port", str(port)])
    try:
        for _ in range(100):  # up to 10 s for it to listen
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers (a 404 for GET /): listening
            except OSError:
                time.sleep(0.1)
        uvloop.run(_profile(args, port))  # the server's loop
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


if __name__ == "__main__":
    main()
