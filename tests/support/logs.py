"""Capturing the warnings a test expects, uvicorn's too, the one a broken stream writes,
and the proxy's request lines."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from proxy.observe.logs import ACCESS


@contextmanager
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture WARNING and up from every logger, uvicorn's too: it does not propagate,
    and "Exception in ASGI application" is logged there."""
    server_logger = logging.getLogger("uvicorn")
    server_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            yield
    finally:
        server_logger.removeHandler(caplog.handler)


@contextmanager
def request_lines(caplog: pytest.LogCaptureFixture) -> Iterator[list[dict[str, Any]]]:
    """The proxy's request lines (their fields), as it writes them: the list fills when
    the block ends."""
    lines: list[dict[str, Any]] = []
    with caplog.at_level(logging.INFO, logger=ACCESS.name):
        yield lines
        lines += [r.__dict__["fields"] for r in caplog.records if r.name == ACCESS.name]


def assert_one_break_warning(caplog: pytest.LogCaptureFixture, cause: str) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    warnings = [r for r in caplog.records if r.name == "proxy.upstream"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].levelno == logging.WARNING
    assert "stream broke mid-body" in warnings[0].getMessage()
    assert cause in warnings[0].getMessage()


HEX_ID = re.compile(r"[0-9a-f]{32}")
