"""What sets one compacting API apart (``Api``), one of its requests as the proxy read it
(``Incoming``), where it goes (``Route``), and what went there (``Attempt``).

Every API the proxy compacts runs the same steps (``pipeline.handle``): read, parse,
model, session, compact, forward, recover an overflow, calibrate. What differs is
its shapes, each a method of its ``Api`` subclass: the request's chat view (the
messages the steps count, plan and rebuild), the body for a view, the output budget
lowered, the prompt's tokens in an answer, a failure at the head of its stream, an
error as its stream carries one, which requests go upstream untouched, and its own
compaction contract. Each API is one module under ``routes/`` with its class and its
one instance (routes/chat.py ``CHAT``, routes/responses.py ``RESPONSES``,
routes/messages.py ``MESSAGES``), served at ``/v1/`` and its path upstream from app.py's
``APIS``: a new API is one more module and one more entry there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from starlette.responses import Response

from proxy.config import CompactionSettings, Settings
from proxy.core.models import ResolvedModel
from proxy.core.outcome import FollowUp, Outcome, Turn
from proxy.core.recall_tool import Call
from proxy.core.tokens import TokenCounter
from proxy.types import ChatMessage, ChatRequest
from proxy.upstream.overflow import Overflow
from proxy.upstream.relay import Rewrite

if TYPE_CHECKING:
    from proxy.tenants import Policy
    from proxy.upstream.output_items import OutputItems

# A summary request's body and the tokens its answer may take (``Api.summary_body``).
SummaryBody = tuple[bytes, int] | None


class Carried(Protocol):
    """What the proxy carries out for a request's API when its upstream cannot (Anthropic's
    ``context_management``: routes/messages_answers.py): the body a view goes as, and the
    edit its answer gets (None: none)."""

    def body_for(self, body: bytes, data: dict[str, Any], outcome: Outcome) -> bytes: ...

    def answer_edit(self, outcome: Outcome) -> Rewrite | None: ...


@dataclass(frozen=True, slots=True)
class Contract:
    """A request as the steps take it under its API's own compaction contract (OpenAI's
    compaction items: routes/compaction_items.py): its body, the object parsed from it
    and its chat view (maybe rewritten), whether it goes upstream untouched, whether it
    compacts as if forced, and the answer the proxy gives itself for the view it
    compacted (None: the upstream answers); what the proxy carries out for the upstream
    (``carried``), and the input tokens past which it compacts (``trigger``: the model's
    own threshold when lower)."""

    body: bytes
    data: dict[str, Any]
    chat: ChatRequest
    untouched: bool = False
    force: bool = False
    answer: Callable[[Turn, Outcome], Awaitable[Response]] | None = None
    carried: Carried | None = None
    trigger: int | None = None


# What a contract's None stands for, but for the request's own body, object and view.
AS_SENT = Contract(b"", {}, cast(ChatRequest, {}))


class Api(ABC):
    """One API's shapes, as the pipeline's steps need them: one subclass per API under
    routes/ (``ChatApi``, ``ResponsesApi``, ``MessagesApi``), one instance of it served.
    What only one API does is a method of its class, so a call leads to the code that
    runs; the defaults here are what an API without that feature does."""

    name: str  # its route's, in metrics and request lines
    path: str  # below the upstream's base URL, as the client's is below /v1/
    # Whether its requests may name items they do not carry (Responses' ``item_reference``:
    # ``references``, ``resolved``), and whether its answers' output items are remembered
    # for them (upstream/output_items.py).
    names_items: bool = False
    keeps_items: bool = False
    recall_tool: ToolShape | None = None  # None: the API never gets the recall tool

    @abstractmethod
    def parse(
        self, body: bytes, max_messages: int, max_model_bytes: int
    ) -> tuple[dict[str, Any], ChatRequest]:
        """The body (at most this many messages or items, a model name of at most this
        many bytes) as a JSON object, and as the chat the steps read: its messages and the
        fields that size the answer. Raises InvalidRequest (the client's 400)."""

    @abstractmethod
    def body_for(self, body: bytes, data: dict[str, Any], outcome: Outcome) -> bytes:
        """The request for a view (the client's body, and the object parsed from it): the
        body itself when the view is the history as sent."""

    @abstractmethod
    def lower_output(self, body: bytes, verdict: Overflow) -> bytes | None:
        """The body with its output budget lowered to what the model allows; None if
        unchanged."""

    @abstractmethod
    def prompt_tokens(self, chunk: bytes) -> int | None:
        """What an answer says the prompt took."""

    @abstractmethod
    def stream_failure(self, head: bytes) -> bytes | None:
        """The data of a stream head's first event when that event is an error (an overflow
        there is recovered)."""

    @abstractmethod
    def stream_error(self, error: dict[str, Any]) -> bytes:
        """An error object as the API's stream carries one."""

    def untouched(self, data: dict[str, Any], control: str) -> bool:
        """Whether a request (parsed, and its X-Compaction value) goes upstream as it came,
        without a session or recovery: its history is not in sight (a chained call)."""
        return False

    def references(self, data: dict[str, Any]) -> list[str]:
        """The ids of the items the request names by reference rather than carries."""
        return []

    def resolved(self, data: dict[str, Any], found: Mapping[str, Any]) -> ChatRequest:
        """The request's chat view with the items it names (id -> item) read in their
        place (compaction/references.py); only for an API that ``names_items``."""
        raise NotImplementedError(f"{self.name} names no items")

    def contract(
        self,
        body: bytes,
        data: dict[str, Any],
        chat: ChatRequest,
        tenants: tuple[str, ...],
        settings: Settings,
    ) -> Contract | None:
        """The request (its body, object, chat view), its tenant (then the legacy id it is
        still known by, while a deployment's ids move: tenants.py) and the settings under
        the API's own compaction contract; None: the request as it came (no contract)."""
        return None

    def as_budget(self, verdict: Overflow) -> Overflow:
        """An overflow answer as this API's recovery reads it (as its classifier did)."""
        return verdict

    def summary_body(
        self, data: dict[str, Any], messages: list[ChatMessage], max_tokens: int
    ) -> SummaryBody:
        """A summary asked as the request itself (compaction/summary_prefix.py): the request
        object with ``messages`` (a prefix of its view, the summary instruction last) as its
        history, unstreamed, its summary in at most ``max_tokens``, whatever else it sent
        kept, so the provider's prompt cache serves the prefix; and the tokens the answer
        may take (thinking's too). None: not so asked (a tool is forced), and the default:
        an API without a summary shape always summarizes a transcript
        (routes/summary_bodies.py)."""
        return None


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
    carried: Carried | None = None  # what the proxy carries out for the upstream

    def body_for(self, outcome: Outcome) -> bytes:
        if self.carried is not None:
            return self.carried.body_for(self.body, self.data, outcome)
        return self.api.body_for(self.body, self.data, outcome)

    def rewrite(self, outcome: Outcome) -> Rewrite | None:
        """How the answer to ``outcome``'s view is edited on its way out (None: not)."""
        return None if self.carried is None else self.carried.answer_edit(outcome)


@dataclass(frozen=True, slots=True)
class Incoming:
    """One request of ``api`` as read (pipeline step 1-2): its body, object and chat view
    (under its contract, ``deal``: ``AS_SENT`` for none), its tenant (and the legacy id it
    is still known by), its model, the headers and credential it goes upstream with, its
    ``X-Compaction`` value, the URL it goes to and where its output items are kept."""

    api: Api
    body: bytes
    data: dict[str, Any]
    chat: ChatRequest
    tenant: str
    legacy: str | None
    deal: Contract
    model: ResolvedModel
    headers: list[tuple[bytes, bytes]]
    auth: list[tuple[bytes, bytes]]
    control: str
    url: str
    kept: OutputItems | None

    @property
    def untouched(self) -> bool:
        """Whether it goes upstream as it came: its API or its contract says so (a chained
        call, an edit the upstream compacts itself), unless the proxy answers it itself or
        carries out for the upstream what the request asks of it."""
        deal = self.deal
        if deal.answer is not None or deal.carried is not None:
            return False
        return self.api.untouched(self.data, self.control) or deal.untouched

    def bypassed(self) -> Attempt:
        """It sent as it came, uncounted (``untouched``)."""
        return Attempt(self.body, Outcome.bypassed(self.body, self.model.context_window))

    def turn(
        self, chat: ChatRequest, named: str | None, counts: tuple[int, int], policy: Policy | None
    ) -> Turn:
        """It as the compaction steps read it: its chat view ``chat`` (the items it names by
        reference read), the session it ``named``, how many items it named by reference and
        how many of those were not read (``counts``), its tenant's ``policy``; and its API
        and object, for a summary asked as the request itself (compaction/summary_prefix.py)."""
        body, model, tenant, auth, trigger = (
            self.body,
            self.model,
            self.tenant,
            self.auth,
            self.deal.trigger,
        )
        return Turn(
            chat, body, model, tenant, named, auth, *counts, policy, self.api, self.data, trigger
        )

    def route(
        self,
        data: dict[str, Any] | None = None,
        recover: bool = False,
        tool: ToolOffer | None = None,
    ) -> Route:
        """Its way upstream, with ``data`` for the object parsed (a tool declared in it)."""
        data = self.data if data is None else data
        carried = self.deal.carried
        return Route(
            self.api, self.url, self.headers, self.body, data, recover, self.kept, tool, carried
        )


@dataclass(frozen=True, slots=True)
class Attempt:
    """What was sent upstream: the body, the view it came from, and the work to start
    once that view's answer (a model's, not an error) has gone out, in order."""

    body: bytes
    outcome: Outcome
    follow_ups: tuple[FollowUp, ...] = ()
