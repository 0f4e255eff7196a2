"""What sets one compacting API apart (``Api``), where one of its requests goes (``Route``),
and what went there (``Attempt``).

Every API the proxy compacts runs the same steps (``pipeline.handle``): read, parse,
model, session, compact, forward, recover an overflow, calibrate. What differs is
its shapes, and an ``Api`` value holds each of them as a function: the request's
chat view (the messages the steps count, plan and rebuild), the body for a view,
the output budget lowered, the prompt's tokens in an answer, a failure at the head of
its stream, an error as its stream carries one, and which requests go upstream
untouched. Each API is one module under ``routes/`` with its ``Api`` (routes/chat.py,
routes/responses.py, routes/messages.py), served at ``/v1/`` and its path upstream from app.py's
``APIS``: a new API is one more module and one more entry there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from starlette.responses import Response

from proxy.config import CompactionSettings, Settings
from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.core.recall_tool import Call
from proxy.core.tokens import TokenCounter
from proxy.types import ChatMessage, ChatRequest
from proxy.upstream.overflow import Overflow

if TYPE_CHECKING:
    from proxy.upstream.output_items import OutputItems

# A summary request's body and the tokens its answer may take (``Api.summary_body``).
SummaryBody = tuple[bytes, int] | None


def no_references(data: dict[str, Any]) -> list[str]:
    """No request of the API names items it does not carry (the chat completions default)."""
    return []


def as_stated(verdict: Overflow) -> Overflow:
    """An overflow answer read as its classifier read it (the default)."""
    return verdict


def never(data: dict[str, Any], control: str) -> bool:
    """No request of the API goes upstream untouched (the chat completions default)."""
    return False


@dataclass(frozen=True, slots=True)
class Contract:
    """A request as the steps take it under its API's own compaction contract (OpenAI's
    compaction items: routes/compaction_items.py): its body, the object parsed from it
    and its chat view (maybe rewritten), whether it goes upstream untouched, whether it
    compacts as if forced, and the answer the proxy gives itself for the view it
    compacted (None: the upstream answers)."""

    body: bytes
    data: dict[str, Any]
    chat: ChatRequest
    untouched: bool = False
    force: bool = False
    answer: Callable[[Turn, Outcome], Awaitable[Response]] | None = None


# What a contract's None stands for, but for the request's own body, object and view.
AS_SENT = Contract(b"", {}, cast(ChatRequest, {}))


@dataclass(frozen=True, slots=True)
class Api:
    """One API's shapes, as the pipeline's steps need them."""

    name: str  # its route's, in metrics and request lines
    path: str  # below the upstream's base URL, as the client's is below /v1/
    # The body (at most this many messages or items, a model name of at most this many
    # bytes) as a JSON object, and as the chat the steps read: its messages and the
    # fields that size the answer. Raises InvalidRequest (the client's 400).
    parse: Callable[[bytes, int, int], tuple[dict[str, Any], ChatRequest]]
    # The request for a view (the client's body, and the object parsed from it): the
    # body itself when the view is the history as sent.
    body_for: Callable[[bytes, dict[str, Any], Outcome], bytes]
    # The body with its output budget lowered to what the model allows; None if unchanged.
    lower_output: Callable[[bytes, Overflow], bytes | None]
    prompt_tokens: Callable[[bytes], int | None]  # what an answer says the prompt took
    # The data of a stream head's first event when that event is an error (an overflow
    # there is recovered); stream_head.error_event reads chat's and Responses' alike.
    stream_failure: Callable[[bytes], bytes | None]
    stream_error: Callable[[dict[str, Any]], bytes]  # an error object as a stream's event
    # Whether a request (parsed, and its X-Compaction value) goes upstream as it came,
    # without a session or recovery: its history is not in sight (a chained call).
    untouched: Callable[[dict[str, Any], str], bool] = never
    # The ids of items the request names by reference rather than carries (Responses'
    # ``item_reference``), and its chat view with those it was given (id -> item) read
    # in their place (compaction/references.py).
    references: Callable[[dict[str, Any]], list[str]] = no_references
    resolved: Callable[[dict[str, Any], Mapping[str, Any]], ChatRequest] | None = None
    # Whether its answers' output items are remembered for later references
    # (upstream/output_items.py).
    keeps_items: bool = False
    # The request (its body, object, chat view), its tenant (then the legacy id it is still
    # known by, while a deployment's ids move: tenants.py) and the settings under the API's
    # own compaction contract; None: the request as it came (the default: none).
    contract: Callable[
        [bytes, dict[str, Any], ChatRequest, tuple[str, ...], Settings], Contract | None
    ] = lambda body, data, chat, tenants, settings: None
    # An overflow answer as this API's recovery reads it: Messages reads Anthropic's
    # "input length and `max_tokens` exceed context limit" as an output budget refusal.
    as_budget: Callable[[Overflow], Overflow] = as_stated
    recall_tool: ToolShape | None = None  # None: the API never gets the recall tool
    # A summary asked as the request itself (compaction/summary_prefix.py): the request
    # object with ``messages`` (a prefix of its view, the summary instruction last) as its
    # history, unstreamed, its summary in at most the given tokens, whatever else it sent
    # kept, so the provider's prompt cache serves the prefix; and the tokens the answer
    # may take (thinking's too). None: not so asked (a tool is forced). An API without one
    # always summarizes a transcript (routes/summary_bodies.py).
    summary_body: Callable[[dict[str, Any], list[ChatMessage], int], SummaryBody] | None = None


@dataclass(frozen=True, slots=True)
class ToolShape:
    """How one API writes tools, their calls and their results: what the recall tool
    (compaction/recall_tool.py) needs to declare itself, read the model's calls in an
    answer (a JSON body, or a whole event stream) and continue the conversation."""

    declared: Callable[[dict[str, Any]], list[str]]  # the names of the request's tools
    declare: Callable[[dict[str, Any]], dict[str, Any]]  # the request with the recall tool
    calls: Callable[[dict[str, Any]], list[Call]]  # every tool call of a JSON answer
    stream_calls: Callable[[bytes], list[Call]]  # every tool call of a whole event stream
    # The request with the answer's calls and, for each, its result appended.
    continued: Callable[[dict[str, Any], list[Call], list[str]], dict[str, Any]]
    no_more_calls: Callable[[dict[str, Any]], dict[str, Any]]  # tool_choice: none
    # An answer read whole (streamed or not) without what it echoes of the request the
    # proxy changed (Responses echoes ``tools`` and ``tool_choice``), as the client's
    # request object had them.
    scrub: Callable[[bytes, bool, dict[str, Any]], bytes] = lambda raw, stream, data: raw


@dataclass(frozen=True, slots=True)
class ToolOffer:
    """The recall tool, declared on one request (compaction/recall_tool.py): its API's
    shape, the client's request object without it (to ask again without it), and what
    its calls are answered within: the turn's settings, token counter and output reserve."""

    shape: ToolShape
    data: dict[str, Any]
    c: CompactionSettings
    counter: TokenCounter
    reserve: int


@dataclass(frozen=True, slots=True)
class Route:
    """One request's way upstream: its API, the URL and headers it goes with, the body
    its client sent and the object parsed from it, and whether an overflow answer is
    recovered (step 10)."""

    api: Api
    url: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    data: dict[str, Any]
    recover: bool = False
    items: OutputItems | None = None  # collects its answer's output items (keeps_items)
    tool: ToolOffer | None = None  # the recall tool declared in its body (``data``)

    def body_for(self, outcome: Outcome) -> bytes:
        return self.api.body_for(self.body, self.data, outcome)


@dataclass(frozen=True, slots=True)
class Attempt:
    """What was sent upstream: the body, the view it came from, and the work to start
    once that view's answer (a model's, not an error) has gone out, in order."""

    body: bytes
    outcome: Outcome
    follow_ups: tuple[FollowUp, ...] = ()
