"""With no ``models:`` at all, a model the upstream describes in its own listing gets the
window the upstream states (X-Context-Window-Source: provider), asked in the background:
the first request uses what was known (the default, the registry), a later one the
upstream's figure; a name the upstream does not list still gets the default, counted; and
an upstream whose listing never answers delays no request. Over real HTTP: the official
SDK, the proxy under uvicorn, the simulator upstream describing its models as vLLM and
llama.cpp do."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.support.metrics import exact_metric, metric
from tests.support.processes import cli, write_config
from tests.support.servers import OPEN_CLIENTS, proxy_settings, run_server

HOUSE = "acme-house-6k"  # in no registry: only the upstream knows its window
DEFAULT = 32_768  # default_model's window


def _simulator(listing: str) -> SimulatorConfig:
    return SimulatorConfig.model_validate(
        {
            "models": [{"match": HOUSE, "context_window": 6000, "max_output_tokens": 1000}],
            "listing": listing,
        }
    )


@pytest.fixture
def vllm_like() -> Iterator[str]:
    with run_server(create_simulator_app(_simulator("vllm"))) as url:
        yield url


@pytest.fixture
def llamacpp_like() -> Iterator[str]:
    with run_server(create_simulator_app(_simulator("llamacpp"))) as url:
        yield url


def _client(url: str, key: str = "sk-discover") -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    OPEN_CLIENTS.append(client)
    return client


def _ask(client: openai.OpenAI, model: str) -> tuple[int, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=16
    )
    return int(raw.headers["x-context-window"]), raw.headers["x-context-window-source"]


def _until_described(client: openai.OpenAI, model: str) -> tuple[int, str]:
    """Ask until the answer's window comes from the upstream (bounded)."""
    deadline = time.monotonic() + 10
    seen = _ask(client, model)
    while seen[1] != "provider" and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = _ask(client, model)
    return seen


def test_a_model_the_upstream_lists_gets_its_window_from_a_later_request(
    vllm_like: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(vllm_like))
    client = _client(url)
    assert _ask(client, HOUSE) == (DEFAULT, "default")  # nothing known yet: never waits
    assert _until_described(client, HOUSE) == (6000, "provider")  # its max_model_len
    assert metric(url, "compaction_proxy_models_resolved", source="provider") == 1
    assert metric(url, "compaction_proxy_model_discoveries", outcome="described") == 1
    # A name the upstream does not list: the registry's, else the default, counted.
    assert _ask(client, "gpt-4o") == (128_000, "registry")
    before = exact_metric(url, "compaction_proxy_default_model_requests_total")
    assert _ask(client, "nobody-lists-this-9") == (DEFAULT, "default")
    assert exact_metric(url, "compaction_proxy_default_model_requests_total") == before + 1
    assert metric(url, "compaction_proxy_model_discoveries") == 1  # asked once, for all


def test_each_caller_asks_with_its_own_credential(
    vllm_like: str, start_proxy: Callable[..., str]
) -> None:
    """Without a key of the proxy's own, what the upstream told one tenant is that tenant's:
    another's first request asks again, with its own key."""
    url = start_proxy(proxy_settings(vllm_like))
    first, second = _client(url, "sk-tenant-one"), _client(url, "sk-tenant-two")
    assert _until_described(first, HOUSE) == (6000, "provider")
    assert _ask(second, HOUSE) == (DEFAULT, "default")
    assert _until_described(second, HOUSE) == (6000, "provider")
    assert metric(url, "compaction_proxy_model_discoveries", outcome="described") == 2


def test_a_llamacpp_server_is_sized_from_props_not_from_its_trained_length(
    llamacpp_like: str, start_proxy: Callable[..., str]
) -> None:
    """llama.cpp lists only n_ctx_train (four times what it serves here); /props says the
    window of a slot. It serves its one model whatever name a request gives."""
    url = start_proxy(proxy_settings(llamacpp_like))
    client = _client(url)
    assert _until_described(client, HOUSE) == (6000, "provider")
    assert _ask(client, "gpt-4o") == (6000, "provider")  # the model it serves is its own


def test_an_upstream_whose_listing_hangs_delays_no_request(
    start_proxy: Callable[..., str], record_property: Callable[[str, object], None]
) -> None:
    """The upstream's /v1/models never answers (the ask runs out its own time in the
    background): requests through it take what requests through an upstream that answers
    at once take, measured side by side."""
    asked = 0
    release = False

    async def hang(request: Request) -> Response:
        nonlocal asked
        asked += 1
        for _ in range(600):  # bounded: 60 s, or until the proxy gives up or the test ends
            if release or await request.is_disconnected():
                break
            await asyncio.sleep(0.1)
        return Response(b"{}", media_type="application/json")

    simulator = create_simulator_app(_simulator("vllm"))
    hanging = Starlette(routes=[Route("/v1/models", hang), Mount("/", app=simulator)])
    with (
        run_server(hanging) as slow,
        run_server(create_simulator_app(_simulator("openai"))) as quick,
    ):
        try:
            # Warmed by a configured model (no ask for it), as the baseline is by its first.
            warm = [{"match": "warm-7", "context_window": 8000, "max_output_tokens": 512}]
            through_hang = _client(start_proxy(proxy_settings(slow, models=warm)))
            baseline = _client(start_proxy(proxy_settings(quick)))
            _ask(through_hang, "warm-7")
            _ask(baseline, HOUSE)
            waits: dict[str, list[float]] = {"hang": [], "base": []}
            for _ in range(15):  # interleaved: both see the same load on this machine
                for name, client in (("hang", through_hang), ("base", baseline)):
                    started = time.perf_counter()
                    assert _ask(client, HOUSE) == (DEFAULT, "default")
                    waits[name].append(time.perf_counter() - started)
            assert asked == 1  # the ask is still in flight: one, however many requests
            hang_p50, base_p50 = (statistics.median(waits[k]) for k in ("hang", "base"))
            record_property("p50_ms", {"hang": hang_p50 * 1e3, "base": base_p50 * 1e3})
            record_property("first_ms", waits["hang"][0] * 1e3)
            assert hang_p50 < 3 * base_p50, (hang_p50, base_p50)
            # The request that started the ask (the first) did not wait for it either.
            assert waits["hang"][0] < 5 * max(waits["base"]), (waits["hang"][0], waits["base"])
        finally:
            release = True


def test_check_config_asks_the_upstream_when_told_to(vllm_like: str, tmp_path: Path) -> None:
    config = {"upstream": {"base_url": f"{vllm_like}/v1"}}
    path = write_config(tmp_path, config)
    args = ("check-config", path, "--no-store", "--model", HOUSE, "--model", "nobody-lists-9")
    asked = cli(*args, "--ask-upstream")
    assert asked.returncode == 0, asked.stderr
    rows = {line.split()[0]: line.split()[1:] for line in asked.stdout.splitlines() if line}
    assert rows[HOUSE] == ["6000", "3000", "from", "provider"]  # half the window reserved
    assert rows["nobody-lists-9"] == ["32768", "4096", "from", "default"]
    offline = cli(*args)  # by default check-config asks nothing of the upstream
    rows = {line.split()[0]: line.split()[1:] for line in offline.stdout.splitlines() if line}
    assert rows[HOUSE] == ["32768", "4096", "from", "default"]


def test_check_config_shows_the_slots_llamacpp_gives_an_entry_without_them(
    tmp_path: Path,
) -> None:
    """A ``models:`` entry that leaves ``slots`` unset takes the server's count when a
    request resolves it (Services.resolved_model): ``--ask-upstream`` shows it so, the
    entry's window and limit kept; an entry that sets its slots is shown as it is."""
    one_slot = SimulatorConfig.model_validate(
        {"models": [{"match": HOUSE, "context_window": 6000}], "listing": "llamacpp", "slots": 1}
    )
    with run_server(create_simulator_app(one_slot)) as url:
        entries = [
            {"match": HOUSE, "context_window": 5000, "max_output_tokens": 500},
            {"match": "declared-2", "context_window": 5000, "max_output_tokens": 500, "slots": 2},
        ]
        path = write_config(tmp_path, {"upstream": {"base_url": f"{url}/v1"}, "models": entries})
        asked = cli(
            "check-config",
            path,
            "--no-store",
            "--model",
            HOUSE,
            "--model",
            "declared-2",
            "--ask-upstream",
        )
    assert asked.returncode == 0, asked.stderr
    rows = {
        line.split()[0]: " ".join(line.split()[1:]) for line in asked.stdout.splitlines() if line
    }
    assert rows[HOUSE] == "5000 500 from config, 1 slot"
    assert rows["declared-2"] == "5000 500 from config, 2 slots"
