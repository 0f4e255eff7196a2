"""Asking the upstream about its models, in the background: one ask at a time per scope,
the first request never waiting, the figures kept for the TTL and asked again while they
still serve, a failure retried a minute later, scopes as the upstream's credentials are,
bounded bodies. An in-process upstream behind the client seam, a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from yarl import URL

from proxy.config import Settings
from proxy.core.models import ResolvedModel
from proxy.errors import UpstreamUnavailable
from proxy.observe.metrics import Metrics
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.discovery import ASKING, MAX_BODY_BYTES, ModelDiscovery
from proxy.upstream.headers import HeaderPolicy
from tests.support.fakes import FakeClock, FakeResponse, Reply, metric

BASE = "http://upstream.invalid/v1"
MODEL = ResolvedModel("house-7", 32_768, 4096, "cl100k_base", "default", source="default")
VLLM = orjson.dumps({"data": [{"id": "house-7", "max_model_len": 6000}]})


@dataclass
class Describer:
    """An upstream answering each GET by its URL's end; what it was asked, in order."""

    replies: dict[str, Reply] = field(default_factory=dict)
    calls: list[tuple[str, list[tuple[bytes, bytes]]]] = field(default_factory=list)

    async def send(
        self,
        method: str,
        url: str | URL,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        assert method == "GET"
        self.calls.append((str(url), headers))
        reply = next((r for end, r in self.replies.items() if str(url).endswith(end)), None)
        reply = reply or Reply(status=404, body=b'{"error": "not found"}')
        if reply.gate is not None:
            await reply.gate.wait()
        if reply.error is not None:
            raise reply.error
        return FakeResponse(reply)

    async def aclose(self) -> None:
        pass


def _discovery(
    upstream: Describer, clock: FakeClock, **upstream_settings: Any
) -> tuple[ModelDiscovery, Metrics]:
    # As a request's route sets it: the headers of the request being served.
    ASKING.set([(b"authorization", b"Bearer sk-caller"), (b"x-session-id", b"s")])
    settings = Settings(upstream={"base_url": BASE, **upstream_settings})
    metrics = Metrics.create()
    headers = HeaderPolicy(settings)
    return ModelDiscovery(settings, upstream, headers, metrics, clock=clock), metrics


async def _settled(discovery: ModelDiscovery) -> None:
    for _ in range(100):
        await asyncio.sleep(0)
    await discovery.aclose()  # nothing left in flight


async def test_the_first_request_uses_what_is_known_and_a_later_one_the_upstreams_word() -> None:
    upstream = Describer({"/v1/models": Reply(body=VLLM)})
    discovery, metrics = _discovery(upstream, FakeClock())
    assert discovery.described(MODEL, "t1") is MODEL  # never waits for the ask
    await _settled(discovery)
    told = discovery.described(MODEL, "t1")
    assert (told.context_window, told.source, told.matched) == (6000, "provider", "provider")
    assert metric(metrics, "model_discoveries", outcome="described") == 1
    # The caller's credential went with it, nothing else of its request.
    ((url, headers),) = upstream.calls
    assert url == f"{BASE}/models"
    assert (b"authorization", b"Bearer sk-caller") in headers
    assert all(name != b"x-session-id" for name, _ in headers)


async def test_one_ask_at_a_time_however_many_requests_come_meanwhile() -> None:
    gate = asyncio.Event()
    upstream = Describer({"/v1/models": Reply(body=VLLM, gate=gate)})
    discovery, _ = _discovery(upstream, FakeClock())
    for _ in range(10):  # before the ask has even started
        assert discovery.described(MODEL, "t1") is MODEL
    for _ in range(10):  # while it waits for its answer
        assert discovery.described(MODEL, "t1") is MODEL
        await asyncio.sleep(0)
    assert len(upstream.calls) == 1
    gate.set()
    await _settled(discovery)
    assert discovery.described(MODEL, "t1").context_window == 6000
    assert len(upstream.calls) == 1


async def test_the_figures_are_asked_again_after_the_ttl_and_serve_meanwhile() -> None:
    clock = FakeClock()
    upstream = Describer({"/v1/models": Reply(body=VLLM)})
    discovery, _ = _discovery(upstream, clock, model_info_ttl_s=600)
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    clock.advance(599)
    assert discovery.described(MODEL, "t1").context_window == 6000
    assert len(upstream.calls) == 1
    clock.advance(2)
    upstream.replies["/v1/models"] = Reply(
        body=orjson.dumps({"data": [{"id": "house-7", "max_model_len": 8000}]})
    )
    assert discovery.described(MODEL, "t1").context_window == 6000  # the old figure, asking
    await _settled(discovery)
    assert discovery.described(MODEL, "t1").context_window == 8000
    assert len(upstream.calls) == 2


async def test_a_failed_ask_is_retried_a_minute_later_not_on_every_request() -> None:
    clock = FakeClock()
    down = Reply(error=UpstreamUnavailable("The upstream could not be reached."))
    upstream = Describer({"/v1/models": down})
    discovery, metrics = _discovery(upstream, clock)
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    for _ in range(10):
        assert discovery.described(MODEL, "t1") is MODEL
    assert len(upstream.calls) == 1
    assert metric(metrics, "model_discoveries", outcome="failed") == 1
    clock.advance(61)
    upstream.replies["/v1/models"] = Reply(body=VLLM)
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    assert discovery.described(MODEL, "t1").context_window == 6000


async def test_without_a_key_of_its_own_each_tenant_asks_for_itself() -> None:
    upstream = Describer({"/v1/models": Reply(body=VLLM)})
    discovery, _ = _discovery(upstream, FakeClock())
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    assert discovery.described(MODEL, "t2") is MODEL  # t1's answer is not t2's
    await _settled(discovery)
    assert discovery.described(MODEL, "t2").context_window == 6000
    assert len(upstream.calls) == 2


async def test_with_a_key_of_its_own_one_ask_serves_every_tenant() -> None:
    upstream = Describer({"/v1/models": Reply(body=VLLM)})
    discovery, _ = _discovery(upstream, FakeClock(), api_key="sk-proxy")
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    assert discovery.described(MODEL, "t2").context_window == 6000
    ((_, headers),) = upstream.calls
    assert (b"authorization", b"Bearer sk-proxy") in headers
    assert (b"authorization", b"Bearer sk-caller") not in headers


async def test_nothing_is_asked_without_a_callers_credential_to_ask_with() -> None:
    upstream = Describer({"/v1/models": Reply(body=VLLM)})
    discovery, _ = _discovery(upstream, FakeClock())
    ASKING.set(None)  # not from a route
    assert discovery.described(MODEL, "t1") is MODEL
    await _settled(discovery)
    assert upstream.calls == []


async def test_a_ttl_of_zero_never_asks() -> None:
    upstream = Describer({"/v1/models": Reply(body=VLLM)})
    discovery, _ = _discovery(upstream, FakeClock(), model_info_ttl_s=0)
    assert discovery.described(MODEL, "t1") is MODEL
    await _settled(discovery)
    assert upstream.calls == []


async def test_llamacpps_props_size_any_name_its_one_model_is_asked_by() -> None:
    listing = orjson.dumps(
        {"data": [{"id": "q.gguf", "owned_by": "llamacpp", "meta": {"n_ctx_train": 40960}}]}
    )
    props = orjson.dumps({"default_generation_settings": {"n_ctx": 8192}})
    upstream = Describer({"/v1/models": Reply(body=listing), "/props": Reply(body=props)})
    discovery, _ = _discovery(upstream, FakeClock())
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    assert discovery.described(MODEL, "t1").context_window == 8192
    assert [url for url, _ in upstream.calls] == [f"{BASE}/models", "http://upstream.invalid/props"]


async def test_a_models_entry_keeps_its_figures_and_takes_the_servers_slot_count() -> None:
    """A ``models:`` entry without ``slots`` in front of llama.cpp: its window and output
    limit stay the entry's, its slots are what ``/props`` says (one: a background summary
    gives way to a turn). An entry that sets ``slots`` keeps them."""
    listing = orjson.dumps({"data": [{"id": "q.gguf", "owned_by": "llamacpp"}]})
    props = orjson.dumps({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1})
    upstream = Describer({"/v1/models": Reply(body=listing), "/props": Reply(body=props)})
    discovery, metrics = _discovery(upstream, FakeClock())
    entry = ResolvedModel("house-7", 4096, 512, "cl100k_base", "house-*", source="config")
    assert discovery.described(entry, "t1") is entry  # never waits for the ask
    await _settled(discovery)
    told = discovery.described(entry, "t1")
    assert (told.context_window, told.max_output_tokens, told.source) == (4096, 512, "config")
    assert told.slots == 1
    assert told.single_slot
    assert metric(metrics, "models_resolved", source="provider") == 0  # its figures its own


async def test_a_listing_without_windows_is_completed_from_litellms_model_info() -> None:
    listing = orjson.dumps({"data": [{"id": "house-7"}, {"id": "other-7"}]})
    info = orjson.dumps(
        {"data": [{"model_name": "house-7", "model_info": {"max_input_tokens": 12000}}]}
    )
    upstream = Describer({"/v1/models": Reply(body=listing), "/model/info": Reply(body=info)})
    discovery, _ = _discovery(upstream, FakeClock())
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    assert discovery.described(MODEL, "t1").context_window == 12000
    assert [url for url, _ in upstream.calls][-1] == f"{BASE}/model/info"


async def test_an_answer_over_the_bound_is_not_read() -> None:
    huge = b'{"data": [' + b" " * MAX_BODY_BYTES + b'{"id": "house-7", "max_model_len": 6000}]}'
    upstream = Describer({"/v1/models": Reply(body=huge)})
    discovery, metrics = _discovery(upstream, FakeClock())
    discovery.described(MODEL, "t1")
    await _settled(discovery)
    assert discovery.described(MODEL, "t1") is MODEL
    assert metric(metrics, "model_discoveries", outcome="silent") == 1


async def test_closing_cancels_an_ask_in_flight() -> None:
    upstream = Describer({"/v1/models": Reply(body=VLLM, gate=asyncio.Event())})
    discovery, _ = _discovery(upstream, FakeClock())
    discovery.described(MODEL, "t1")
    await asyncio.sleep(0)
    await asyncio.wait_for(discovery.aclose(), 5)
    assert discovery.described(MODEL, "t1") is MODEL
