"""Issue 23 item 7: the image's HEALTHCHECK command, run against a real proxy.

No image is built here (no Docker daemon): the command the Dockerfile gives HEALTHCHECK
runs as it would in the container, with the proxy's port in PROXY_SERVER__PORT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import serve_process
from tests.support.servers import free_port
from tests.test_image import instructions


def healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    (check,) = [i for i in instructions() if i.startswith("HEALTHCHECK")]
    command = json.loads(check.split(" CMD ", 1)[1])
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        env={**os.environ, "PROXY_SERVER__PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_healthcheck_passes_on_the_configured_port_only(sim_reset: str, tmp_path: Path) -> None:
    config = {"upstream": {"base_url": f"{sim_reset}/v1"}}
    with serve_process(tmp_path, config) as served:
        port = int(served.url.rsplit(":", 1)[1])
        assert healthcheck(port).returncode == 0
        assert healthcheck(free_port()).returncode != 0
