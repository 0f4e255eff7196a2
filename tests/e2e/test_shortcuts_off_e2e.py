"""A proxy process started with ``COMPACTION_PROXY_SHORTCUTS=off`` runs on the frameworks'
public APIs only (proxy/shortcuts/): it says so once per framework, and answers as one
with its shortcuts on does. The rest of the suite runs that way too with the variable set
(docs/architecture.md, "Framework shortcuts"; CI runs a part of it: .ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.shortcuts import gate
from tests.support.processes import CHAT, serve_process

OFF = "shortcuts off ({}=off): its public API serves"


def _exchange(url: str) -> list[object]:
    """A whole answer and a streamed one, without what varies between runs."""
    whole = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30)
    streamed = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    body = orjson.loads(whole.content)
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    return [
        whole.status_code,
        whole.headers["content-length"] == str(len(whole.content)),
        body["choices"][0]["message"],
        streamed.status_code,
        streamed.headers["content-type"].split(";")[0],
        len(events) > 2,
        events[-1],
    ]


@pytest.mark.parametrize("switch", ["off", None], ids=["off", "on"])
def test_the_switch_off_serves_the_same_answers_on_public_apis(
    tmp_path: Path, sim_reset: str, monkeypatch: pytest.MonkeyPatch, switch: str | None
) -> None:
    if switch is None:
        monkeypatch.delenv(gate.SWITCH, raising=False)
    else:
        monkeypatch.setenv(gate.SWITCH, switch)
    config = {"upstream": {"base_url": f"{sim_reset}/v1"}}
    with serve_process(tmp_path, config) as served:
        answers = _exchange(served.url)
        served.process.terminate()
        assert served.wait(timeout=30) == 0
    assert answers[0] == answers[3] == 200
    assert answers[1] is True
    assert answers[4] == "text/event-stream"
    assert answers[5] is True
    assert answers[6] == "data: [DONE]"
    said = [line for line in served.log().splitlines() if "shortcuts off" in line]
    if switch is None:
        assert said == []
    else:
        expected = [f"{name} " + OFF.format(gate.SWITCH) for name in gate.TESTED]
        assert sorted(x for x in expected if any(x in line for line in said)) == sorted(expected)
        assert len(said) == 3, said  # once each


_MOVED = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
import aiohttp, starlette.applications, starlette.middleware.body_limit, starlette.routing
import uvicorn.protocols.http.httptools_impl, uvicorn.protocols.utils  # (they use them)
del uvicorn.protocols.utils.get_client_addr, starlette._utils.is_async_callable
del aiohttp.helpers.TimerNoop
from starlette.applications import Starlette
from proxy.shortcuts.aiohttp_request import on_path
from proxy.shortcuts.starlette_routing import application
from proxy.shortcuts.uvicorn_cycle import UvicornSide, request_side
assert request_side()[0] is UvicornSide
assert type(application(fast=[])) is Starlette
assert not on_path()
"""


def test_a_release_that_moved_an_internal_serves_the_public_path() -> None:
    """The tested series, but an internal a shortcut imports is gone (as a patch release
    could do): the shortcut modules still load, and the gate keeps their shortcuts off."""
    done = subprocess.run(
        [sys.executable, "-c", _MOVED],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, gate.SWITCH: "on"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert len(said) == 3, said
    for line, name in zip(sorted(said), ("aiohttp", "starlette", "uvicorn"), strict=True):
        assert line.startswith(f"WARNING {name} shortcuts off ({name} "), line
        assert "lacks what they use (ImportError: cannot import name" in line, line
