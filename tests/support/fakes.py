"""In-process fakes for the orchestration tests: the upstream behind its seam, and a clock.

``FakeUpstream`` stands where ``proxy.upstream.client.UpstreamClient`` stands (it satisfies
``proxy.upstream.seam.Upstream``) and answers from scripts: the proxy's own summary calls
(they carry ``x-compaction-purpose: summarize``) from one queue, every other call from
another, a default answer when a queue is empty. An answer may wait for an
``asyncio.Event`` (to hold a summary in flight while other requests arrive), fail to
connect, or be an error body exactly as a provider wrote it (``overflow_reply`` takes
them from ``tests/fixtures/overflow/cases.json``). Every call is recorded.

``FakeClock`` is what the modules that take a ``clock`` (and the compactor's
``sleep``) are given: time passes only when a test says so, or, with
``advance_on_sleep``, by exactly what the code under test sleeps.

``make_services`` assembles what ``proxy.services.build_services`` does, around
these fakes and an in-process store: no server, no socket. ``conversation`` makes
histories sized against the fake model's 4k window, ``turn_of`` a request of them.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.compaction.caps import TenantCaps
from proxy.compaction.chunking import ChunkSize
from proxy.compaction.compact import Compactor
from proxy.compaction.inflight import BodyBudget
from proxy.compaction.precompact import Precompactor
from proxy.compaction.recall import Recall
from proxy.compaction.recall_tool import RecallTool
from proxy.compaction.schedule import Schedule
from proxy.compaction.sightings import SessionSightings
from proxy.compaction.summarize import PURPOSE_HEADER
from proxy.compaction.summary_request import SummaryRequest
from proxy.config import Settings
from proxy.core.encodings import EstimateEncoder
from proxy.core.models import ModelTable
from proxy.core.outcome import Turn
from proxy.core.prompts import prompt_for
from proxy.core.tenant_ids import TenantIds
from proxy.core.tokens import TokenCounter
from proxy.errors import UpstreamError
from proxy.observe.ledger import Ledger
from proxy.observe.metrics import Metrics
from proxy.services import Services
from proxy.store import Store, build_archive
from proxy.store.items import MemoryItems
from proxy.store.memory import MemoryStore
from proxy.store.quota import MemoryQuota
from proxy.tenants import TenantPolicies
from proxy.types import ChatMessage
from proxy.upstream.calibrate import Calibration
from proxy.upstream.ceilings import LearnedCeilings
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.headers import HeaderPolicy
from proxy.upstream.output_items import ItemWrites
from proxy.upstream.windows import LearnedWindows, WindowPolicy
from tests.support.faulty_upstream import handoff

_CASES = Path(__file__).parents[1] / "fixtures" / "overflow" / "cases.json"
_JSON = (("content-type", "application/json"),)


class FakeClock:
    """Monotonic time that moves only when told to."""

    def __init__(self, now: float = 1000.0, *, advance_on_sleep: bool = False) -> None:
        self.now = now
        self.advance_on_sleep = advance_on_sleep
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Yield to the loop once; the time slept passes only with ``advance_on_sleep``."""
        self.sleeps += 1
        if self.advance_on_sleep:
            self.now += seconds
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Reply:
    """One scripted upstream answer."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = _JSON
    # An event stream's body, sent in these pieces (``body`` is then ignored).
    chunks: tuple[bytes, ...] | None = None
    gate: asyncio.Event | None = None  # the answer comes only once this is set
    error: UpstreamError | None = None  # raised by ``send``: no answer at all


def _completion(
    text: str, finish_reason: str = "stop", extra: dict[str, Any] | None = None
) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                }
            ],
            **(extra or {}),
        }
    )


def chat_reply(text: str = "ok", *, prompt_tokens: int | None = None) -> Reply:
    usage = None if prompt_tokens is None else {"usage": {"prompt_tokens": prompt_tokens}}
    return Reply(body=_completion(text, extra=usage))


def summary_reply(
    text: str = handoff(),
    *,
    finish_reason: str = "stop",
    gate: asyncio.Event | None = None,
) -> Reply:
    return Reply(body=_completion(text, finish_reason), gate=gate)


def summary_request(
    upstream: FakeUpstream, max_calls: int = 16, max_tokens: int = 400
) -> SummaryRequest:
    """A chat summary request to ``upstream``, every chunk in one call."""
    return SummaryRequest(
        client=upstream,
        api="chat",
        url="http://upstream.invalid/v1/chat/completions",
        headers=[],
        model="fake",
        max_tokens=max_tokens,
        timeout_s=10,
        chunking=ChunkSize(1_000_000),
        max_calls=max_calls,
        prompt=prompt_for(max_tokens),
    )


def span(count: int = 40) -> list[ChatMessage]:
    """``count`` alternating user and assistant turns of filler: what a summary covers."""
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: {FILLER}"}
        for i in range(count)
    ]


def error_reply(
    status: int, message: str = "upstream failed", *, gate: asyncio.Event | None = None
) -> Reply:
    return Reply(status=status, body=orjson.dumps({"error": {"message": message}}), gate=gate)


@cache
def _cases() -> dict[str, dict[str, Any]]:
    return {case["id"]: case for case in json.loads(_CASES.read_text())}


def overflow_case(case_id: str) -> dict[str, Any]:
    """A provider's error answer from the overflow corpus, with what it states."""
    return _cases()[case_id]


def overflow_reply(case_id: str) -> Reply:
    """The error answer ``case_id`` of the overflow corpus, status and headers as found."""
    case = overflow_case(case_id)
    headers = {"content-type": "application/json", **case.get("headers", {})}
    return Reply(status=case["status"], body=case["body"].encode(), headers=tuple(headers.items()))


def stream_reply(*events: bytes) -> Reply:
    """A 200 event stream made of ``events`` (each a whole SSE event, blank line included)."""
    return Reply(headers=(("content-type", "text/event-stream"),), chunks=events)


class FakeResponse(UpstreamResponse):
    """An ``UpstreamResponse`` whose bytes come from a ``Reply``, not a socket."""

    __slots__ = ("_chunks", "_headers", "_raw", "_status", "closed")

    def __init__(self, reply: Reply) -> None:
        self.started = None
        self._status = reply.status
        chunks = reply.chunks if reply.chunks is not None else (reply.body,)
        headers = list(reply.headers)
        if reply.chunks is None:
            headers.append(("content-length", str(len(reply.body))))
        self._headers = CIMultiDictProxy(CIMultiDict(headers))
        self._raw = tuple((k.encode(), v.encode()) for k, v in headers)
        self._chunks = deque(chunks)
        self.closed = False

    @property
    def status_code(self) -> int:
        return self._status

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._headers

    @property
    def raw_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return self._raw

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while self._chunks:
            yield self._chunks.popleft()

    async def aread_closed(self) -> bytes:
        body = b"".join(self._chunks)
        self._chunks.clear()
        await self.aclose()
        return body

    async def aclose(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class Call:
    """One request the fake upstream received."""

    method: str
    url: str
    headers: list[tuple[bytes, bytes]]
    body: dict[str, Any]

    @property
    def is_summary(self) -> bool:
        return PURPOSE_HEADER in self.headers

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body.get("messages", [])
        return messages


@dataclass
class FakeUpstream:
    """Scripted answers for summary calls and all others; what it received, in order."""

    chats: deque[Reply] = field(default_factory=deque)
    summaries: deque[Reply] = field(default_factory=deque)
    calls: list[Call] = field(default_factory=list)
    responses: list[FakeResponse] = field(default_factory=list)
    # Set when a summary call arrives (the lock holder is summarizing), or any other call.
    summary_started: asyncio.Event = field(default_factory=asyncio.Event)
    chat_started: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    def script(self, *, chats: Iterable[Reply] = (), summaries: Iterable[Reply] = ()) -> None:
        self.chats.extend(chats)
        self.summaries.extend(summaries)

    @property
    def summary_calls(self) -> list[Call]:
        return [c for c in self.calls if c.is_summary]

    @property
    def chat_calls(self) -> list[Call]:
        return [c for c in self.calls if not c.is_summary]

    async def send(
        self,
        method: str,
        url: str | URL,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        assert not isinstance(content, AsyncIterator), "bodies are sent whole here"
        call = Call(method, str(url), list(headers), orjson.loads(content) if content else {})
        self.calls.append(call)
        if call.is_summary:
            self.summary_started.set()
            reply = self.summaries.popleft() if self.summaries else summary_reply()
        else:
            self.chat_started.set()
            reply = self.chats.popleft() if self.chats else chat_reply()
        if reply.gate is not None:
            await reply.gate.wait()
        if reply.error is not None:
            raise reply.error
        response = FakeResponse(reply)
        self.responses.append(response)
        return response

    async def aclose(self) -> None:
        self.closed = True


MODEL = "fake-4k"
WINDOW = 4096


def fake_settings(**compaction: Any) -> Settings:
    """A small window (4k, 256 reserved for the reply) so a few dozen messages overflow it."""
    return Settings(
        upstream={"base_url": "http://upstream.invalid/v1"},
        models=[{"match": MODEL, "context_window": WINDOW, "max_output_tokens": 256}],
        # One summary call per compaction: the summarizer's window takes any span here.
        compaction={"summary_max_tokens": 400, "summarizer_context_window": 65536, **compaction},
    )


def make_services(
    settings: Settings,
    upstream: FakeUpstream,
    clock: FakeClock,
    *,
    store: Store | None = None,
    metrics: Metrics | None = None,
) -> Services:
    """What ``build_services`` assembles, around the fakes: the store (a ``MemoryStore``
    on ``clock`` unless given; pass one store to several to play replicas), and a
    characters-per-token estimate for every tokenizer (no tokenizer files to load)."""
    metrics = metrics or Metrics.create()
    store = store or MemoryStore(ttl_s=settings.store.ttl_s, clock=clock)
    models = ModelTable(settings)
    counters = {name: TokenCounter(EstimateEncoder(name)) for name in models.tokenizers()}
    tenant_ids = TenantIds.from_settings(settings)
    archive = build_archive(store)
    compactor = Compactor(
        settings=settings,
        store=store,
        counters=counters,
        client=upstream,
        models=models,
        metrics=metrics,
        clock=clock,
        sleep=clock.sleep,
        caps=TenantCaps(MemoryQuota(clock), metrics.tenants, clock),
        archive=archive,
    )
    recall = Recall(archive, metrics, settings.compaction, counters)
    return Services(
        settings=settings,
        client=upstream,
        headers=HeaderPolicy(settings),
        models=models,
        store=store,
        counters=counters,
        calibration=Calibration(),
        schedule=Schedule(settings.compaction.force_interval_s, compactor.memory, clock=clock),
        compactor=compactor,
        windows=LearnedWindows(store, WindowPolicy.from_settings(settings), metrics, clock=clock),
        ceilings=LearnedCeilings(store, WindowPolicy.from_settings(settings), metrics, clock=clock),
        metrics=metrics,
        precompactor=Precompactor(settings.compaction, compactor, metrics, clock=clock),
        sightings=SessionSightings(store, memory=compactor.memory, clock=clock),
        bodies=BodyBudget(settings.server),
        items=ItemWrites(MemoryItems(settings.store.ttl_s, clock=clock)),
        ledger=Ledger(metrics.registry, settings.pricing),
        policies=TenantPolicies(settings, tenant_ids.legacy_of),
        tenant_ids=tenant_ids,
        recall=recall,
        recall_tool=RecallTool(recall, upstream, metrics.registry, settings.compaction, counters),
    )


FILLER = "please keep careful notes about the project as we go along. " * 6  # ~100 tokens


def conversation(turns: int, *, extra: int = 0) -> list[ChatMessage]:
    """System prompt, ``turns`` user/assistant pairs, a question; then ``extra`` more pairs.

    14 turns (~3,000 tokens) pass the 4k window's trigger but fit in it; 22 do not fit.
    """
    messages: list[ChatMessage] = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t}: {FILLER}"})
        messages.append({"role": "assistant", "content": f"Noted turn {t}. {FILLER}"})
    messages.append({"role": "user", "content": "What did we cover?"})
    for t in range(extra):
        messages.append({"role": "assistant", "content": f"Covered {t}. {FILLER}"})
        messages.append({"role": "user", "content": f"More {t}: {FILLER}"})
    return messages


TENANT = "tenant-a"


async def turn_of(services: Services, messages: list[ChatMessage], session: str = "s1") -> Turn:
    """One request of ``TENANT`` for ``messages`` in header session ``session``."""
    chat: Any = {"model": MODEL, "messages": messages}
    return Turn(
        chat=chat,
        body=orjson.dumps(chat),
        model=await services.effective_model(MODEL, TENANT),
        tenant=TENANT,
        session_header=session,
        auth_headers=[(b"authorization", b"Bearer sk-test")],
    )


async def until(condition: Callable[[], bool], rounds: int = 1000) -> None:
    """Let the loop run until ``condition()`` holds: bounded, each round one pass of it."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"compaction_proxy_{name}_total", labels) or 0.0
