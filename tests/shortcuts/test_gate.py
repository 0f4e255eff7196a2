"""The gate in front of every framework shortcut (proxy/shortcuts/gate.py): a shortcut runs
on the release series it follows and the switch not off; otherwise each one's public-API
path is the one picked, and the fallback is said once."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from proxy.config import ServerSettings
from proxy.serve.limits import limited_protocol
from proxy.shortcuts import gate
from proxy.shortcuts.aiohttp_request import LeanRequest, on_path
from proxy.shortcuts.starlette_request import ProxyRequest, request_class
from proxy.shortcuts.starlette_response import Relayed, Relaying, Streamed, peeked, whole
from proxy.shortcuts.starlette_routing import Dispatch, application
from proxy.shortcuts.uvicorn_cycle import Cycle, RequestSide, UvicornSide, request_side
from proxy.upstream.client import UpstreamClient
from tests.support.servers import proxy_settings
from tests.support.shortcuts import pretend, switch


@pytest.mark.parametrize(
    ("framework", "version"),
    [
        ("uvicorn", "0.54.0"),
        ("uvicorn", "0.54.7"),
        ("starlette", "1.10.0"),
        ("starlette", "1.10.3rc1"),
        ("aiohttp", "3.14.5"),
        ("aiohttp", "3.14.0"),
    ],
)
def test_the_tested_series_may_take_its_shortcuts(framework: gate.Framework, version: str) -> None:
    assert gate.decide(framework, version, None) is None
    assert gate.decide(framework, version, "on") is None


@pytest.mark.parametrize(
    ("framework", "version"),
    [
        ("uvicorn", "0.55.0"),
        ("uvicorn", "0.53.1"),
        ("uvicorn", "1.54.0"),
        ("starlette", "1.11.0"),
        ("starlette", "0.10.0"),
        ("aiohttp", "3.15.0"),
        ("aiohttp", "4.0"),
        ("aiohttp", "3.1"),
        ("aiohttp", "3"),
        ("aiohttp", "dev"),
    ],
)
def test_another_release_takes_the_public_path(framework: gate.Framework, version: str) -> None:
    why = gate.decide(framework, version, None)
    assert why is not None
    assert version in why


@pytest.mark.parametrize("value", ["off", "OFF", " off ", "0", "false", "no"])
def test_the_switch_turns_every_shortcut_off(value: str) -> None:
    for framework, (major, minor) in gate.TESTED.items():
        assert gate.decide(framework, f"{major}.{minor}.0", value) == f"{gate.SWITCH}={value}"


def test_the_installed_releases_are_the_tested_ones(shortcuts_on: None) -> None:
    """constraints.txt pins what gate.TESTED names: the suite runs the shortcuts."""
    assert all(gate.on(framework) for framework in gate.TESTED)


def test_a_fallback_is_said_once_per_framework(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pretend(monkeypatch, starlette="1.11.0")
    with caplog.at_level(logging.INFO, logger="proxy.shortcuts"):
        assert [gate.on("starlette") for _ in range(3)] == [False] * 3
        assert gate.on("uvicorn")
        assert gate.on("aiohttp")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            logging.WARNING,
            "starlette shortcuts off (starlette 1.11.0 is not the tested 1.10 series): "
            "its public API serves",
        )
    ]
    caplog.clear()
    switch(monkeypatch, False)
    with caplog.at_level(logging.INFO, logger="proxy.shortcuts"):
        assert not gate.on("uvicorn")
        assert not gate.on("uvicorn")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"uvicorn shortcuts off ({gate.SWITCH}=off): its public API serves")
    ]


def test_uvicorn_off_its_series_serves_uvicorns_own_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    switch(monkeypatch, True)
    assert request_side() == (RequestSide, Cycle)
    pretend(monkeypatch, uvicorn="0.55.0")
    assert request_side() == (UvicornSide, RequestResponseCycle)
    protocol = limited_protocol(ServerSettings())
    assert not issubclass(protocol, RequestSide)
    assert protocol.cycle_class is RequestResponseCycle  # type: ignore[attr-defined]


def test_starlette_off_its_series_serves_starlettes_own_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switch(monkeypatch, True)
    assert request_class() is ProxyRequest
    assert type(application(fast=[])) is Dispatch
    assert type(whole(b"{}", 200, [])) is Relayed
    pretend(monkeypatch, starlette="1.11.0")
    assert request_class() is Request
    assert type(application(fast=[])) is Starlette
    answer = whole(b"{}", 201, [(b"content-length", b"2"), (b"x-a", b"1"), (b"x-a", b"2")])
    assert type(answer) is Response
    assert (answer.body, answer.status_code) == (b"{}", 201)
    assert answer.raw_headers == [(b"content-length", b"2"), (b"x-a", b"1"), (b"x-a", b"2")]


class _Source:
    status_code = 200

    async def aclose(self) -> None:
        pass


async def _chunks():  # type: ignore[no-untyped-def]
    yield b"data: 1\n\n"


async def test_a_peeked_stream_off_starlettes_series_is_a_plain_relay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switch(monkeypatch, True)
    chunks = _chunks()
    assert type(peeked(chunks, _Source(), [])) is Streamed
    await chunks.aclose()
    pretend(monkeypatch, starlette="1.11.0")
    chunks = _chunks()
    out = peeked(chunks, _Source(), [(b"content-type", b"text/event-stream")])
    assert type(out) is Relaying
    assert out.raw_headers == [(b"content-type", b"text/event-stream")]
    await chunks.aclose()


async def test_aiohttp_off_its_series_sends_through_the_sessions_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = proxy_settings("http://127.0.0.1:9/v1")
    switch(monkeypatch, True)
    client = UpstreamClient(settings)
    assert on_path()
    assert client._lean
    assert client._session._request_class is LeanRequest
    await client.aclose()
    pretend(monkeypatch, aiohttp="3.15.0")
    client = UpstreamClient(settings)
    assert not on_path()
    assert not client._lean
    assert client._session._request_class is aiohttp.ClientRequest
    await client.aclose()
