"""No merge-conflict markers in any tracked text file: a merge once committed the README
with them, and no other test read those lines."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(rb"^(<{7}|>{7}) ", re.MULTILINE)


def test_no_tracked_file_holds_a_conflict_marker() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    found = []
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if path.is_file() and MARKER.search(path.read_bytes()):
            found.append(name.decode())
    assert found == []
