"""What each session held by the embedded store costs in memory: the figure behind the
chart's memory limit (helm/compaction-proxy/values.yaml, ``memorySizing``).

    python bench/session_memory.py [--sessions 50000] [--summary-bytes 5500]

In one process, no servers: fills a ``MemoryStore`` (the ``memory://`` store, and the
local state a Redis-backed proxy serves from) with ``--sessions`` sessions, each one
snapshot with a summary of ``--summary-bytes`` and one sighting, over 50 tenants, and
prints the process's resident memory over its start every 10,000 sessions. That is the
store's share only: issue 23 measured a whole proxy at +91-98 MiB per 10,000 sessions
of 5.5 KB summaries (the rest: per-session caches around the store).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.core.session import SessionKey
from proxy.store import Sighting, Snapshot
from proxy.store.memory import MemoryStore

MIB = 2**20


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


async def fill(sessions: int, summary_bytes: int) -> list[tuple[int, float]]:
    store = MemoryStore(ttl_s=3600, max_sessions=sessions, max_per_tenant=sessions)
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(5000)]
    gc.collect()
    base, marks = rss_mib(), []
    for i in range(sessions):
        key = SessionKey(f"{i % 50:064x}", f"{i:032x}", "header")
        summary = " ".join(rng.choices(words, k=summary_bytes // 4))[:summary_bytes]
        now = time.time()
        anchor = f"{rng.getrandbits(128):032x}"
        snapshot = Snapshot(1, summary, 1, 40, 40, anchor, 1400, 30000, 8000, now, now, "gpt-4o")
        assert await store.save(key, snapshot)
        await store.note_seen(key, Sighting(42, 9000, "gpt-4o", now))
        if (i + 1) % 10_000 == 0:
            gc.collect()
            marks.append((i + 1, rss_mib() - base))
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50_000)
    parser.add_argument("--summary-bytes", type=int, default=5500)
    args = parser.parse_args()
    marks = asyncio.run(fill(args.sessions, args.summary_bytes))
    for count, grown in marks:
        print(f"{count:>7} sessions: +{grown:6.1f} MiB  ({grown / count * 10_000:5.1f} per 10,000)")


if __name__ == "__main__":
    main()
