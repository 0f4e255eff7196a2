"""Where the time goes: py-spy raw profiles as µs per request by component.

    python bench/spy_table.py lean.raw@300 proxy.raw@480 [...]

Each argument is a ``py-spy record --format raw`` file and the target's CPU µs per request
(``cpu_per_request.py``); the table splits that CPU by component, the one of the innermost
frame that is not the standard library's plumbing (asyncio, dataclasses, threading...).
Samples of a thread waiting (the log writer's) are left out. Issue 27, bench/README.md
"Where the time goes".
"""

from __future__ import annotations

import sys
from collections import Counter

COMPONENTS = (
    ("record, metrics, log line, ledger", ("proxy/observe/", "prometheus_client", "core/ledger")),
    ("server limits (serve/limits.py)", ("proxy/serve/limits",)),
    ("header work (upstream/headers.py)", ("proxy/upstream/headers",)),
    ("body read + parse (orjson)", ("compaction/inflight", "routes/parse", "routes/chat")),
    ("relay / response construction", ("upstream/relay", "starlette/responses")),
    ("disconnect watcher", ("upstream/disconnect",)),
    ("upstream client wrapper", ("upstream/client",)),
    ("windows, calibration, models", ("upstream/windows", "calibrate", "core/models")),
    ("session, tenant, digests", ("core/session", "core/digest")),
    ("pipeline (bound, refs, sightings...)", ("proxy/", "cachetools")),
    ("lean floor's handler (orjson, headers)", ("passthrough_lean",)),
    ("starlette routing and middleware", ("starlette/", "uvicorn/middleware")),
    ("aiohttp client", ("aiohttp/", "aiohappyeyeballs", "yarl", "multidict")),
    ("uvicorn + httptools", ("uvicorn/",)),
    ("event loop (uvloop)", ("asyncio/runners",)),
)
_PLUMBING = ("asyncio/", "dataclasses", "threading", "<string>", "contextlib", "typing", "abc")


def component(frames: list[str]) -> str:
    for frame in reversed(frames):
        if any(p in frame for p in _PLUMBING) and "asyncio/runners" not in frame:
            continue
        for name, patterns in COMPONENTS:
            if any(p in frame for p in patterns):
                return name
        if frame.strip():
            return "other"
    return "other"


def table(path: str) -> Counter[str]:
    """Each component's share of the samples of ``path`` (waiting threads left out)."""
    counts: Counter[str] = Counter()
    with open(path) as raw:
        for line in raw:
            if not line.strip():
                continue
            stack, n = line.rstrip().rsplit(" ", 1)
            frames = stack.split(";")
            if any("threading" in f or "_Writer._run" in f for f in frames):
                continue  # the log writer: waiting, or waiting for the GIL
            counts[component(frames)] += int(n)
    total = sum(counts.values())
    return Counter({k: v / total for k, v in counts.items()})


def main() -> None:
    runs = [(arg.split("@")[0], float(arg.split("@")[1])) for arg in sys.argv[1:]]
    shares = [table(path) for path, _ in runs]
    names = sorted(set().union(*shares), key=lambda n: -max(s[n] for s in shares))
    print(" | ".join(["component", *(path for path, _ in runs)]))
    for name in names:
        cells = [f"{s[name] * us:.1f}" for s, (_, us) in zip(shares, runs, strict=True)]
        print(" | ".join([name, *cells]))
    print(" | ".join(["total (CPU µs per request)", *(f"{us:.0f}" for _, us in runs)]))


if __name__ == "__main__":
    main()
