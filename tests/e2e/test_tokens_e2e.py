"""tokens.py under load: counting a huge text in a worker thread leaves other threads
running. What the proxy counts: tests/core/test_tokens.py.
"""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from tests.support.encoders import ENCODER, _tiktoken_encoding


@pytest.mark.e2e  # counts 24 MiB: a load test, kept out of the fast tier
def test_counting_a_huge_text_in_a_thread_leaves_other_threads_running() -> None:
    """The event loop keeps its turns while a worker thread counts 24 MiB (the GIL is free)."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do "
    text = words * (24 * 1024 * 1024 // len(words))
    result: list[int] = []
    counting = threading.Thread(target=lambda: result.append(ENCODER.count(text)))
    gaps, took = _turn_gaps(counting)
    assert result == [len(_tiktoken_encoding().encode_ordinary(text))]
    assert len(gaps) > 10
    # The baseline: the same turns while a thread keeps a core as busy for as long
    # without holding the GIL (hashing a large buffer releases it): what the machine's
    # load alone makes of the gaps now.
    block = b"x" * (16 * 1024 * 1024)
    until = time.monotonic() + took
    hashing = threading.Thread(target=lambda: _hash_until(block, until))
    baseline, _ = _turn_gaps(hashing)
    # Turning 5 million ids into a list holds the GIL for ~0.1 s; the buffer form ~0.
    bound = 0.04 + max(baseline)
    assert max(gaps) < bound, f"the GIL was held for {max(gaps):.3f} s (bound {bound:.3f} s)"


def _hash_until(block: bytes, until: float) -> None:
    while time.monotonic() < until:
        hashlib.sha256(block).digest()


def _turn_gaps(worker: threading.Thread) -> tuple[list[float], float]:
    """The gaps between this thread's 1 ms naps while ``worker`` runs, and how long it ran."""
    gaps: list[float] = []
    started = last = time.monotonic()
    worker.start()
    deadline = last + 60
    while worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    worker.join(timeout=60)
    return gaps, time.monotonic() - started
