"""SSE comments a thinking model's server sends before the first event reach the client
as they come, and an overflow in that first event is still recovered (issue 20, item 7).

OpenRouter sends ``: OPENROUTER PROCESSING`` every second while a model thinks. The
proxy holds a stream until its first event to recover from an overflow reported
there; held comments reached the client only with that event (after 8 s), and a load
balancer with an idle timeout would cut such a stream through the proxy.

In-process: tests/upstream/test_stream_comments.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import httpx
import openai
import orjson
import pytest

from tests.support.chat import chat_requests, stats
from tests.support.faulty_upstream import DONE, FaultyUpstream, answer, chunk_event, stream
from tests.support.servers import OPEN_CLIENTS, proxy_settings, run_proxy
from tests.support.streams import OVERFLOW_ERROR, REAL, long_history

THINKING = {"X-Sim-Thinking-Ms": "2000", "X-Sim-Comment-Interval-Ms": "300"}


OVERFLOW = {"X-Sim-Context-Window": str(REAL), "X-Sim-Errors-In-Stream": "1"}


MODELS = [{"match": "sim-big", "context_window": 32768, "max_output_tokens": 256}]


def first_byte_and_body(url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """How long the first body byte came before the first ``data:`` event (seconds; a
    comment held back until the first event comes with it: about 0), the status,
    headers and the whole body. Both times are on the same stream: a busy machine that
    delays everything does not move their difference much, the model's thinking does."""
    started = time.perf_counter()
    with httpx.stream(
        "POST",
        f"{url}{path}",
        json=body,
        headers={"Authorization": "Bearer sk-a", **headers},
        timeout=60,
    ) as r:
        raw, first_at, data_at = b"", None, None
        for chunk in r.iter_raw():
            now = time.perf_counter() - started
            first_at = now if first_at is None else first_at
            raw += chunk
            if data_at is None and b"data:" in raw:
                data_at = now
        assert first_at is not None, raw
        assert data_at is not None, raw
        return data_at - first_at, r.status_code, r.headers, raw


def data_events(raw: bytes) -> list[dict[str, Any]]:
    return [
        orjson.loads(line[6:])
        for line in raw.decode().splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": "sim-big", "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/responses", {"model": "sim-big", "input": "hi"}),
    ],
)
def test_comments_reach_the_client_as_they_come(
    sim_reset: str, start_proxy: Callable[..., str], path: str, body: dict[str, Any]
) -> None:
    url = start_proxy(proxy_settings(sim_reset, models=MODELS))
    ahead, status, headers, raw = first_byte_and_body(url, path, {**body, "stream": True}, THINKING)
    assert status == 200
    assert raw.startswith(b": PROCESSING\n\n")
    # The model thinks for 2 s: comments sent meanwhile come well before its answer.
    assert ahead > 1.0, f"the first comment came {ahead:.2f} s before the first event"
    assert raw.count(b": PROCESSING") >= 6  # every comment, each once
    assert headers["x-compaction-status"] == "passthrough"
    assert data_events(raw), "the answer follows the comments"
    # Byte for byte what the upstream sent (the simulator is deterministic).
    direct = httpx.post(f"{sim_reset}{path}", json={**body, "stream": True}, headers=THINKING)
    assert raw == direct.content


def test_an_overflow_after_comments_is_recovered_within_the_same_response(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset, models=MODELS))
    headers = {**OVERFLOW, **THINKING, "X-Sim-Thinking-Ms": "900"}
    body = {"model": "sim-big", "messages": long_history(), "stream": True}
    ahead, status, _, raw = first_byte_and_body(url, "/v1/chat/completions", body, headers)
    assert status == 200
    assert ahead > 0.45, f"the first comment came {ahead:.2f} s before the first event"
    events = data_events(raw)
    assert events
    assert all("error" not in e for e in events), events[0]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert raw.endswith(b"data: [DONE]\n\n")
    sent = chat_requests(sim_reset)
    assert len(sent) == 2  # the stream that failed, then exactly one retry
    assert len(orjson.dumps(sent[1]["body"]["messages"])) < len(orjson.dumps(long_history()))

    # The official SDK reads it as one valid stream.
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-a", max_retries=0)
    OPEN_CLIENTS.append(client)  # closed at teardown, before the heap is collected
    messages = cast(Any, long_history())
    chunks = list(
        client.chat.completions.create(
            model="sim-big", messages=messages, stream=True, extra_headers=headers
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_responses_overflow_after_comments_is_recovered_within_the_same_response(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset, models=MODELS))
    headers = {**OVERFLOW, **THINKING, "X-Sim-Thinking-Ms": "900"}
    items = [{"role": m["role"], "content": m["content"]} for m in long_history()]
    body = {"model": "sim-big", "input": items, "stream": True}
    ahead, status, _, _ = first_byte_and_body(url, "/v1/responses", body, headers)
    assert (status, ahead > 0.45) == (200, True), f"the first comment came {ahead:.2f} s early"
    assert len(chat_requests(sim_reset)) == 2  # recovered: the failed stream and one retry

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-a", max_retries=0)

    OPEN_CLIENTS.append(client)  # closed at teardown, before the heap is collected
    stream = client.responses.create(
        model="sim-big", input=cast(Any, items), stream=True, extra_headers=headers
    )
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created"
    assert kinds.count("response.created") == 1, kinds
    assert kinds[-1] == "response.completed", kinds
    assert "response.failed" not in kinds


def test_a_client_that_leaves_while_comments_flow_cancels_the_upstream_call(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(proxy_settings(sim_reset, models=MODELS))
    body = {"model": "sim-big", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {**THINKING, "X-Sim-Thinking-Ms": "10000", "Authorization": "Bearer sk-a"}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        assert next(r.iter_raw()).startswith(b": PROCESSING")
    deadline = time.monotonic() + 30  # a stream left running ends as completed
    while stats(sim_reset).get("streams_abandoned", 0) < 1:
        assert time.monotonic() < deadline, "the upstream call outlived its client"
        time.sleep(0.05)


@pytest.fixture
def faulty() -> Iterator[FaultyUpstream]:
    with FaultyUpstream() as up:
        yield up


@pytest.mark.e2e  # a FaultyUpstream and a proxy on loopback
def test_a_retry_that_fails_after_comments_ends_the_stream_with_an_error_event(
    faulty: FaultyUpstream,
) -> None:
    """The client already has a 200 and comments: the retry's 400 cannot be its status,
    so it comes as one error event in the API's shape, the upstream's own error object,
    which the SDK raises."""
    calls = [0]
    comment = b": OPENROUTER PROCESSING\n\n"
    error = b"data: " + OVERFLOW_ERROR + b"\n\n"

    async def overflow_then_fail(upstream: FaultyUpstream, ex: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            await stream(comment, comment, error, DONE)(upstream, ex)
        else:
            await answer(400, OVERFLOW_ERROR)(upstream, ex)

    faulty.chat = overflow_then_fail
    settings = proxy_settings(faulty.url, models=[{"match": "m", "context_window": 32768}])
    with run_proxy(settings) as url:
        body = {"model": "m", "messages": long_history(), "stream": True}
        _, status, _, raw = first_byte_and_body(url, "/v1/chat/completions", body, {})
        assert status == 200
        assert raw.startswith(comment + comment)
        assert data_events(raw) == [orjson.loads(OVERFLOW_ERROR)]
        assert len(faulty.requests()) == 2
        calls[0] = 0
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-a", max_retries=0)
        OPEN_CLIENTS.append(client)  # closed at teardown, before the heap is collected
        with pytest.raises(openai.APIError, match="maximum context length"):
            list(
                client.chat.completions.create(
                    model="m", messages=cast(Any, long_history()), stream=True
                )
            )


@pytest.mark.e2e  # a FaultyUpstream and a proxy on loopback
def test_a_stream_that_is_not_an_overflow_is_relayed_whole_after_its_comments(
    faulty: FaultyUpstream,
) -> None:
    comment = b": keep-alive\n\n"
    faulty.chat = stream(comment, chunk_event("hel"), comment, chunk_event("lo"), DONE)
    settings = proxy_settings(faulty.url, models=[{"match": "m", "context_window": 32768}])
    with run_proxy(settings) as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        _, status, _, raw = first_byte_and_body(url, "/v1/chat/completions", body, {})
    assert status == 200
    assert raw == comment + chunk_event("hel") + comment + chunk_event("lo") + DONE
