"""``pipeline.handle`` for the chat API, in-process against a fake upstream: overflow
recovery (step 10) in the formats providers really use (``tests/fixtures/overflow``),
and the steps around it.

An overflow teaches the tenant's window, compacts against it and retries exactly once;
a second failure goes back to the client as the upstream wrote it; an output budget
lowers ``max_tokens`` instead; anything else is relayed untouched.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message

from proxy import pipeline
from proxy.compaction.job import Job
from proxy.compaction.precompact import Precompactor
from proxy.core.session import SessionKey, session_from_header, tenant_from_headers
from proxy.errors import ClientDisconnected
from proxy.routes.chat import CHAT
from proxy.routes.passthrough import handle_passthrough
from proxy.routes.responses import RESPONSES
from proxy.services import Services
from proxy.store import Sighting
from proxy.store.memory import MemoryStore
from proxy.types import ChatMessage
from tests.support.fakes import (
    MODEL,
    WINDOW,
    FakeClock,
    FakeUpstream,
    Reply,
    chat_reply,
    conversation,
    error_reply,
    fake_settings,
    make_services,
    metric,
    overflow_case,
    overflow_reply,
    stream_reply,
)
from tests.support.faulty_upstream import handoff

KEY = "sk-tenant-a"
TENANT = tenant_from_headers({"authorization": f"Bearer {KEY}"})


def http_request(
    body: bytes,
    headers: dict[str, str],
    *,
    method: str = "POST",
    path: str = "/v1/chat/completions",
    gone: asyncio.Event | None = None,
) -> Request:
    """A request as the ASGI server hands it over; the client leaves once ``gone`` is set."""
    raw = [
        (b"authorization", f"Bearer {KEY}".encode()),
        *((k.lower().encode(), v.encode()) for k, v in headers.items()),
    ]
    if body:
        raw += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": raw,
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
    }
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await (gone or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    return Request(scope, receive)


async def send_chat(
    services: Services,
    messages: list[ChatMessage],
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    body = orjson.dumps({"model": MODEL, "messages": messages, **extra})
    headers = {"x-session-id": "s1", **(headers or {})}
    return await asyncio.wait_for(pipeline.handle(http_request(body, headers), services, CHAT), 2)


async def body_of(response: Response) -> bytes:
    if isinstance(response, StreamingResponse):
        return b"".join([bytes(chunk) async for chunk in response.body_iterator])  # type: ignore[arg-type]
    return bytes(response.body)


def header(response: Response, name: str) -> str:
    return response.headers[name]


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def services(upstream: FakeUpstream) -> Services:
    return make_services(fake_settings(), upstream, FakeClock())


HISTORY = conversation(12)  # below the trigger: sent as it is, until the upstream objects


@pytest.mark.parametrize(
    "case_id",
    [
        "openai-messages-resulted-in",  # states its limit and our count
        "anthropic-prompt-too-long",  # a limit far above the configured window
        "gemini-native-with-count",
        "nginx-413-html",  # a gateway's 413: no limit, HTML
    ],
)
async def test_an_overflow_teaches_the_window_compacts_and_retries_once(
    services: Services, upstream: FakeUpstream, case_id: str
) -> None:
    upstream.script(chats=[overflow_reply(case_id), chat_reply("answered")])
    response = await send_chat(services, HISTORY)

    assert response.status_code == 200
    assert orjson.loads(await body_of(response))["choices"][0]["message"]["content"] == "answered"
    first, retry = upstream.chat_calls
    assert first.messages == HISTORY, "the first attempt is the history as sent"
    assert len(upstream.summary_calls) == 1
    assert len(retry.messages) < len(HISTORY)
    assert retry.messages[-1] == HISTORY[-1]
    learned = await services.windows.get(MODEL, TENANT)
    assert learned is not None
    assert learned < WINDOW
    assert header(response, "x-compaction-status") == "compacted"
    assert header(response, "x-context-window") == str(learned)
    assert int(header(response, "x-context-tokens")) <= learned
    provider = overflow_case(case_id)["provider"]
    metrics = services.metrics
    labels = {"provider": provider, "kind": "overflow"}
    assert metric(metrics, "upstream_overflows", **labels, outcome="recovered") == 1
    assert all(r.closed for r in upstream.responses), "the rejected answer was read and closed"


async def test_a_second_overflow_is_relayed_as_the_upstream_wrote_it(
    services: Services, upstream: FakeUpstream
) -> None:
    second = overflow_reply("openai-messages-resulted-in")
    upstream.script(chats=[overflow_reply("openai-messages-resulted-in"), second])
    response = await send_chat(services, HISTORY)

    assert response.status_code == 400
    assert await body_of(response) == second.body
    assert len(upstream.chat_calls) == 2, "retried once, not again"
    assert header(response, "x-compaction-status") == "compacted"
    labels = {"provider": "openai", "kind": "overflow"}
    assert metric(services.metrics, "upstream_overflows", **labels, outcome="failed") == 1
    assert metric(services.metrics, "upstream_overflows", **labels, outcome="recovered") == 0


async def test_the_next_turn_plans_against_the_learned_window_without_a_retry(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[overflow_reply("openai-messages-resulted-in")])
    await send_chat(services, HISTORY)
    learned = await services.windows.get(MODEL, TENANT)
    history: list[ChatMessage] = [
        *HISTORY,
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    response = await send_chat(services, history)

    assert response.status_code == 200
    assert header(response, "x-context-window") == str(learned)
    assert len(upstream.chat_calls) == 3, "one retry for the first turn, none for the second"


async def test_an_output_budget_error_lowers_max_tokens_and_retries_once(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[overflow_reply("openai-max-tokens-too-large")])
    response = await send_chat(services, HISTORY, max_tokens=8192)

    assert response.status_code == 200
    first, retry = upstream.chat_calls
    assert (first.body["max_tokens"], retry.body["max_tokens"]) == (8192, 4096)
    assert retry.messages == HISTORY, "nothing else about the request changes"
    assert upstream.summary_calls == []
    assert await services.windows.get(MODEL, TENANT) is None
    labels = {"provider": "openai", "kind": "output_budget", "outcome": "recovered"}
    assert metric(services.metrics, "upstream_overflows", **labels) == 1


async def test_other_errors_are_relayed_without_a_retry(
    services: Services, upstream: FakeUpstream
) -> None:
    refused = error_reply(400, "Invalid value for 'temperature'.")
    upstream.script(chats=[refused])
    response = await send_chat(services, HISTORY)
    assert response.status_code == 400
    assert await body_of(response) == refused.body
    assert len(upstream.calls) == 1
    assert header(response, "x-compaction-status") == "passthrough"


async def test_compaction_off_relays_even_an_overflow(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[overflow_reply("openai-messages-resulted-in")])
    response = await send_chat(services, HISTORY, {"x-compaction": "off"})
    assert response.status_code == 400
    assert len(upstream.calls) == 1
    assert header(response, "x-compaction-status") == "bypassed"
    assert await services.windows.get(MODEL, TENANT) is None


async def test_recovery_runs_with_compaction_disabled(upstream: FakeUpstream) -> None:
    services = make_services(fake_settings(enabled=False), upstream, FakeClock())
    upstream.script(chats=[overflow_reply("anthropic-prompt-too-long")])
    response = await send_chat(services, HISTORY)
    assert response.status_code == 200
    assert len(upstream.chat_calls) == 2
    assert header(response, "x-compaction-status") == "compacted"


ERROR_EVENT = (
    b'data: {"error": {"message": "This model\'s maximum context length is 4097 tokens. '
    b'However, your messages resulted in 4294 tokens.", "code": "context_length_exceeded"}}\n\n'
)
ANSWER_EVENTS = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "he"}}]}\n\n',
    b'data: {"choices": [{"index": 0, "delta": {"content": "llo"}}]}\n\n',
    b"data: [DONE]\n\n",
)


async def test_a_stream_that_opens_with_an_overflow_is_recovered_before_any_byte(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[stream_reply(ERROR_EVENT), stream_reply(*ANSWER_EVENTS)])
    response = await send_chat(services, HISTORY, stream=True)
    assert response.status_code == 200
    assert await body_of(response) == b"".join(ANSWER_EVENTS)
    assert len(upstream.chat_calls) == 2
    assert header(response, "x-compaction-status") == "compacted"


async def test_a_stream_that_fits_is_relayed_byte_for_byte(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[stream_reply(*ANSWER_EVENTS)])
    response = await send_chat(services, HISTORY, stream=True)
    assert await body_of(response) == b"".join(ANSWER_EVENTS)
    assert len(upstream.calls) == 1
    assert all(r.closed for r in upstream.responses)


async def test_an_error_too_big_to_be_an_overflow_is_relayed_whole(
    services: Services, upstream: FakeUpstream
) -> None:
    huge = error_reply(400, "context_length_exceeded " + "x" * 300_000)
    upstream.script(chats=[huge])
    response = await send_chat(services, HISTORY)
    assert response.status_code == 400
    assert await body_of(response) == huge.body
    assert len(upstream.calls) == 1


async def test_an_output_budget_already_within_the_limit_is_not_retried(
    services: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[overflow_reply("openai-max-tokens-too-large")])  # "at most 4096"
    response = await send_chat(services, HISTORY, max_tokens=100)
    assert response.status_code == 400
    assert len(upstream.calls) == 1, "the same request would fail the same way"


# --- what a turn leaves for once its answer is out -------------------------------------


class LoggedStore(MemoryStore):
    """A store that logs the follow-ups a turn leaves as they run (``ran``): the write
    of its sighting here; the start of a background compaction, with ``followed``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(ttl_s=3600, clock=clock)
        self.ran: list[str] = []

    async def note_seen(self, key: SessionKey, sighting: Sighting) -> None:
        self.ran.append("sighting")
        await super().note_seen(key, sighting)


@pytest.fixture
def followed(upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> Services:
    clock = FakeClock()
    services = make_services(fake_settings(), upstream, clock, store=LoggedStore(clock))
    start = Precompactor.start

    async def logged(self: Precompactor, job: Job) -> None:
        ran(services).append("precompact")
        await start(self, job)

    monkeypatch.setattr(Precompactor, "start", logged)
    return services


def ran(services: Services) -> list[str]:
    assert isinstance(services.store, LoggedStore)
    return services.store.ran


async def sent(services: Services, response: Response) -> list[str]:
    """``response`` sent as the server sends one (its body, then its background work,
    with the background compactions it starts), and the follow-ups that ran meanwhile."""
    await body_of(response)
    assert ran(services) == [], "nothing runs before the answer is out"
    if response.background is not None:
        await response.background()
    await asyncio.wait_for(asyncio.gather(*services.precompactor.running.values()), 2)
    return ran(services)


async def test_a_named_turn_is_noted_then_precompacted_once_its_answer_is_out(
    followed: Services, upstream: FakeUpstream
) -> None:
    """HISTORY is past the soft threshold: the turn's sighting is written first (GET
    /sessions/{id}), then its session compacts in the background."""
    response = await send_chat(followed, HISTORY)
    assert await sent(followed, response) == ["sighting", "precompact"]
    assert await followed.store.load_seen(session_from_header(TENANT, "s1")) is not None
    assert len(upstream.summary_calls) == 1, "the background compaction ran"


async def test_an_output_budget_retry_keeps_the_turns_follow_ups(
    followed: Services, upstream: FakeUpstream
) -> None:
    upstream.script(chats=[overflow_reply("openai-max-tokens-too-large")])
    response = await send_chat(followed, HISTORY, max_tokens=8192)
    assert response.status_code == 200
    assert await sent(followed, response) == ["sighting", "precompact"]


async def test_a_retry_with_a_view_compacted_again_runs_only_that_views_follow_ups(
    followed: Services, upstream: FakeUpstream
) -> None:
    """The retried view is compacted: nothing to pre-compact, and no sighting (a turn that
    recovered with a new view leaves the next turn due)."""
    upstream.script(chats=[overflow_reply("openai-messages-resulted-in")])
    response = await send_chat(followed, HISTORY)
    assert header(response, "x-compaction-status") == "compacted"
    assert await sent(followed, response) == []


@pytest.mark.parametrize(
    ("events", "follow_ups"),
    [
        ((b": PROCESSING\n\n", *ANSWER_EVENTS), ["sighting", "precompact"]),
        ((b": PROCESSING\n\n", ERROR_EVENT), []),  # recovered in-stream with a new view
    ],
)
async def test_a_stream_held_for_its_first_event_runs_the_follow_ups_of_what_it_answers(
    followed: Services, upstream: FakeUpstream, events: tuple[bytes, ...], follow_ups: list[str]
) -> None:
    upstream.script(chats=[stream_reply(*events), stream_reply(*ANSWER_EVENTS)])
    response = await send_chat(followed, HISTORY, stream=True)
    assert await sent(followed, response) == follow_ups


# --- the steps around recovery --------------------------------------------------------


async def test_the_providers_prompt_count_calibrates_ours(
    services: Services, upstream: FakeUpstream
) -> None:
    history = conversation(14)  # counted: only counted requests calibrate
    upstream.script(chats=[chat_reply(prompt_tokens=20_000)])
    response = await send_chat(services, history)
    assert header(response, "x-compaction-status") == "compacted"
    assert services.calibration.factor(TENANT, MODEL) > 1.0


@pytest.mark.parametrize("recover_overflow", [True, False])
async def test_a_responses_answers_input_tokens_calibrate_ours(
    upstream: FakeUpstream, recover_overflow: bool
) -> None:
    """The Responses route runs the same steps 9-12: calibration does not depend on
    whether overflow recovery is on."""
    services = make_services(
        fake_settings(recover_overflow=recover_overflow), upstream, FakeClock()
    )
    system, *rest = conversation(14)
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in rest]
    body = orjson.dumps({"model": MODEL, "instructions": system["content"], "input": items})
    upstream.script(chats=[Reply(body=b'{"usage": {"input_tokens": 20000}}')])
    # The summary is asked as the turn's own request, on the Responses API: its answer so.
    output = [{"type": "message", "content": [{"type": "output_text", "text": handoff()}]}]
    upstream.script(summaries=[Reply(body=orjson.dumps({"status": "completed", "output": output}))])
    request = http_request(body, {"x-session-id": "s1"}, path="/v1/responses")
    response = await asyncio.wait_for(pipeline.handle(request, services, RESPONSES), 2)
    assert header(response, "x-compaction-status") == "compacted"
    assert upstream.chat_calls[-1].url.endswith("/responses")
    assert upstream.summary_calls[0].url.endswith("/responses")
    assert services.calibration.factor(TENANT, MODEL) > 1.0


async def test_a_client_that_leaves_while_the_upstream_thinks_cancels_the_call(
    services: Services, upstream: FakeUpstream
) -> None:
    never = asyncio.Event()
    upstream.script(chats=[Reply(body=b"{}", gate=never)])
    gone = asyncio.Event()
    body = orjson.dumps({"model": MODEL, "messages": HISTORY})
    task = asyncio.create_task(pipeline.handle(http_request(body, {}, gone=gone), services, CHAT))
    await asyncio.wait_for(upstream.chat_started.wait(), 2)
    gone.set()
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(task, 2)
    assert metric(services.metrics, "client_disconnects", phase="upstream") == 1


async def test_other_calls_are_relayed_untouched(
    services: Services, upstream: FakeUpstream
) -> None:
    models = Reply(body=b'{"object": "list", "data": []}')
    upstream.script(chats=[models])
    request = http_request(b"", {}, method="GET", path="/v1/models")
    response = await handle_passthrough(request, services)
    assert (response.status_code, await body_of(response)) == (200, models.body)
    (call,) = upstream.calls
    assert (call.method, call.url) == ("GET", "http://upstream.invalid/v1/models")
