"""encodings.py end to end: start-up loading, in a process of its own whose HTTP(S) proxy
accepts connections and never answers, never waits on the network. The loading order
in-process: tests/core/test_encodings.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.e2e  # starts a process
def test_start_up_loading_never_waits_on_the_network(tmp_path: Path) -> None:
    """Nothing patched: a real process whose HTTP(S) proxy accepts connections and never
    answers. tiktoken downloads without a timeout, so one attempt would hang there."""
    script = (
        "from proxy.core.encodings import load_encoders\n"
        "encoders = load_encoders(['o200k_base', 'cl100k_base', 'p50k_base'])\n"
        "print(sorted((name, e.exact) for name, e in encoders.items()))\n"
    )
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(8)
        proxy = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        env.pop("DATA_GYM_CACHE_DIR", None)
        env |= {"TIKTOKEN_CACHE_DIR": str(tmp_path), "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy}
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            cwd=Path(__file__).parents[2],
            capture_output=True,
            text=True,
            timeout=120,  # a download attempt never ends: it would hang until this
        )
        blackhole.setblocking(False)
        with pytest.raises(BlockingIOError):
            blackhole.accept()  # nobody ever connected to the proxy
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        [("cl100k_base", True), ("o200k_base", False), ("p50k_base", False)]
    )
