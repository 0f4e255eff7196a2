"""tokens.py under load: counting a huge text in a worker thread leaves other threads
running. What the proxy counts: tests/core/test_tokens.py.
"""

from __future__ import annotations

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
    worker = threading.Thread(target=lambda: result.append(ENCODER.count(text)))
    gaps: list[float] = []
    last = time.monotonic()
    worker.start()
    deadline = last + 60
    while worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    worker.join(timeout=60)
    assert result == [len(_tiktoken_encoding().encode_ordinary(text))]
    assert len(gaps) > 10
    # Turning 5 million ids into a list holds the GIL for ~0.1 s; the buffer form ~0.
    assert max(gaps) < 0.04, f"the GIL was held for {max(gaps):.3f} s"
