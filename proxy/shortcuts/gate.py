"""Whether a framework's shortcuts may run: its release series is the tested one, and the
switch is not off.

``COMPACTION_PROXY_SHORTCUTS=off`` in the proxy's environment turns every shortcut off, so
the proxy runs on the frameworks' public APIs only (the suite passes either way; CI runs a
part of it with them off). It is read once per process, like the versions: a switch about
the code that runs, not about what the proxy does, so it is not a setting. Each framework's
decision is logged once when it falls back.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from importlib import metadata
from typing import Literal

log = logging.getLogger("proxy.shortcuts")

Framework = Literal["uvicorn", "starlette", "aiohttp"]
SWITCH = "COMPACTION_PROXY_SHORTCUTS"
# The release series each framework's shortcuts follow step for step (constraints.txt pins
# one release of each; pyproject.toml bounds each below its next minor).
TESTED: dict[Framework, tuple[int, int]] = {
    "uvicorn": (0, 54),
    "starlette": (1, 10),
    "aiohttp": (3, 14),
}


def series(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a release's version string, or None if it has none."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


# Frameworks whose internals a shortcut module could not import (another release moved
# them): their shortcuts stay off, whatever the version says.
_MISSING: dict[Framework, str] = {}


def missing(framework: Framework, exc: Exception) -> None:
    """Called by a shortcut module whose import of ``framework``'s internals failed: the
    module still loads (its public path serves), and ``on`` says no (the first cause),
    from now on even if it said yes before this module was imported."""
    _MISSING.setdefault(framework, f"{type(exc).__name__}: {exc}")
    on.cache_clear()


def decide(framework: Framework, version: str, switch: str | None) -> str | None:
    """Why ``framework``'s shortcuts must not run (installed at ``version``, the switch's
    value ``switch``, or an internal they import missing), or None when they may."""
    if (switch or "").strip().lower() in ("off", "0", "false", "no"):
        return f"{SWITCH}={switch}"
    tested = TESTED[framework]
    if series(version) != tested:
        return f"{framework} {version} is not the tested {tested[0]}.{tested[1]} series"
    if framework in _MISSING:
        return f"{framework} {version} lacks what they use ({_MISSING[framework]})"
    return None


@cache
def on(framework: Framework) -> bool:
    """Whether ``framework``'s shortcuts run in this process (decided once; logged once
    when not)."""
    switch = os.environ.get(SWITCH)
    why = decide(framework, metadata.version(framework), switch)
    if why is None:
        return True
    # Asked for: a note. Another release: a warning, as the public path may be slower.
    level = logging.INFO if why.startswith(SWITCH) else logging.WARNING
    log.log(level, "%s shortcuts off (%s): its public API serves", framework, why)
    return False
