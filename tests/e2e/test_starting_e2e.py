"""tests.support.starting, the start of every server process the tests run: a taken
port is tried again on a fresh one (and another server answering on it does not count
as ours), and a process that fails to start says why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support import starting
from tests.support.servers import run_server
from tests.support.starting import StartFailed, start_listening


def _simulator(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "proxy",
        "simulate-upstream",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


async def _ok(request: object) -> PlainTextResponse:
    return PlainTextResponse("not the simulator")


def test_a_taken_port_is_tried_again_on_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another server holds the first port picked, and answers the readiness check there.
    other = Starlette(routes=[Route("/v1/models", _ok)])
    with run_server(other) as url:
        taken = int(url.rsplit(":", 1)[1])
        picks = iter([taken, starting.free_port()])
        monkeypatch.setattr(starting, "free_port", lambda: next(picks))
        process, port = start_listening(_simulator, tmp_path / "sim.log", "/v1/models", "sim")
        try:
            assert port != taken
            assert starting.listens_on(process.pid, port)
        finally:
            process.kill()
            process.wait(timeout=30)


def test_a_process_that_exits_while_starting_shows_its_output(tmp_path: Path) -> None:
    def argv(port: int) -> list[str]:
        return [
            sys.executable,
            "-c",
            "import sys; print('no config here', file=sys.stderr); sys.exit(3)",
        ]

    with pytest.raises(StartFailed, match="exit 3") as failed:
        start_listening(argv, tmp_path / "log", "/healthz", "the proxy")
    assert "no config here" in str(failed.value)
    assert not failed.value.port_in_use
