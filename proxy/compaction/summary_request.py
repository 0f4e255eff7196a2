"""Within step 7 (summarize.py asks it): the summary call for one turn's session.

Sized for the summarizer's window in its tokens (chunking.py), its budget the proxy's own
(core/budget.py), capped by what the summarizer can write; sent to the upstream's
``upstream.summarizer_api`` with a transcript, or as the turn's own request in its own
API when ``compaction.summary_prompt: cached`` allows it (summary_prefix.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from proxy.compaction.chunking import ChunkSize
from proxy.compaction.summary_api import PATHS, SummarizerApi
from proxy.config import Settings
from proxy.core.budget import summary_limit
from proxy.core.models import ModelTable
from proxy.core.outcome import Turn
from proxy.core.prompts import FULL, SIMPLE, TERSER, Prompt, prompt_for
from proxy.core.tokens import TokenCounter
from proxy.errors import SummaryError
from proxy.observe.record import current_record
from proxy.types import ChatMessage
from proxy.upstream.seam import Upstream
from proxy.upstream.urls import upstream_url

if TYPE_CHECKING:
    from proxy.compaction.summary_prefix import Prefix

# The tokenizer's error and the chat template's tokens, as chunking.py spares them.
_MARGIN_SHARE = 16
_TEMPLATE_TOKENS = 16
# The APIs whose answers summary_api.py reads, by the name of the ``Api`` they come on.
_READ: dict[str, SummarizerApi] = {name: name for name in PATHS}


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """Everything the summarizer needs that does not change per chunk."""

    client: Upstream
    api: SummarizerApi  # chat completions, Responses or Messages (summary_api.py)
    url: str
    headers: list[tuple[bytes, bytes]]
    model: str
    max_tokens: int
    timeout_s: float
    chunking: ChunkSize  # how much of the span one call may take (chunking.py)
    max_calls: int = 16  # compaction.max_summary_calls: the most one summary may make
    prompt: Prompt = FULL  # the instructions: fewer sections for a small budget
    cached: CachedAsk | None = None  # asked as the turn's request (summary_prefix.py)
    window: int = 0  # the summarizer's, in its tokens

    @classmethod
    def for_turn(
        cls,
        turn: Turn,
        settings: Settings,
        models: ModelTable,
        client: Upstream,
        counters: dict[str, TokenCounter],
    ) -> SummaryRequest:
        """The summary call for ``turn``'s session, sized for the summarizer's window in
        its tokens (``counters``: by tokenizer name), with a transcript."""
        c = turn.compaction(settings.compaction)  # its tenant's policy's
        summarizer = models.resolve(c.summarizer_model) if c.summarizer_model else turn.model
        window = c.summarizer_context_window or summarizer.context_window
        # The proxy's own budget, not the reply reserve (a summary cut short loses its
        # end), capped by what the summarizer can write when configured.
        max_tokens = summary_limit(turn.model, c)
        if c.summarizer_max_output_tokens:
            max_tokens = min(max_tokens, c.summarizer_max_output_tokens)
        counter = counters.get(summarizer.tokenizer) or counters[turn.model.tokenizer]
        api = settings.upstream.summarizer_api
        return cls(
            client=client,
            api=api,
            url=upstream_url(settings.upstream.base_url, PATHS[api], b""),
            # The request's id too: the upstream's logs tie the summary to the request.
            headers=[*turn.auth_headers, (b"x-request-id", current_record().request_id.encode())],
            model=c.summarizer_model or turn.chat["model"],
            max_tokens=max_tokens,
            timeout_s=c.summary_timeout_s,
            chunking=ChunkSize.for_window(window, max_tokens, counter),
            max_calls=c.max_summary_calls,
            prompt=prompt_for(max_tokens),
            window=window,
        )

    def within(self, cap: int | None) -> SummaryRequest:
        """This call asking for at most ``cap`` tokens (None: as it is), the most its
        summarizer is known to write in its time (pace.py). Its chunks stay as large as
        for its first budget: a shorter answer only leaves them more room."""
        if cap is None or cap >= self.max_tokens:
            return self
        return replace(self, max_tokens=cap, prompt=prompt_for(cap))

    def after(self, turn: Turn, prefix: Prefix | None, base_url: str) -> SummaryRequest:
        """This call asked as ``turn``'s own request after ``prefix`` (what its view sent
        up to the cut: summary_prefix.py) where it may be, else as it is."""
        # Caches are per model: only the turn's own reads what the turn's requests wrote.
        if prefix is None or self.model != turn.chat["model"]:
            return self
        # The turn's own model: its window, whatever a summarizer's is configured at.
        room = (min(self.window, turn.model.context_window), self.max_tokens)
        cached = cached_ask(turn, prefix, base_url, room, self.chunking.size)
        if cached is None:
            return self
        return replace(self, api=cached.api, url=cached.url, cached=cached)


@dataclass(frozen=True, slots=True)
class CachedAsk:
    """A summary asked as the turn's request: its API (whose answer is read), the URL it
    goes to, the request object, the prefix, and the API's summary shape."""

    api: SummarizerApi
    url: str
    data: dict[str, Any]
    prefix: list[ChatMessage]
    shape: Callable[[dict[str, Any], list[ChatMessage], int], tuple[bytes, int] | None]

    def body(self, prompt: Prompt, extra: str, max_tokens: int) -> tuple[bytes, int]:
        """The request asking for ``prompt``'s summary (``extra``: more said after it, the
        terser request) in at most ``max_tokens``, and the tokens its answer may take."""
        said = f"{prompt.cached}\n\n{extra}" if extra else prompt.cached
        body = self.shape(
            self.data, [*self.prefix, ChatMessage(role="user", content=said)], max_tokens
        )
        if body is None:  # the shape said yes when asked first (cached_ask): never here
            raise SummaryError("the request has no summary shape")
        return body


def cached_ask(
    turn: Turn, prefix: Prefix, base_url: str, room: tuple[int, int], size: Callable[[str], int]
) -> CachedAsk | None:
    """``turn``'s summary asked after ``prefix`` when it may be (summary_prefix.py says
    when); ``room``: the summarizer's window and the answer's ``max_tokens``, ``size``:
    a text's tokens in the summarizer's tokenizer."""
    api, data = turn.api, turn.data
    if api is None or data is None:
        return None
    kind = _READ.get(api.name)
    if kind is None:
        return None
    window, max_tokens = room
    asked = max(size(prompt_for(max_tokens).cached), size(SIMPLE.cached))
    asked += size(TERSER.format(limit=max_tokens)) + _TEMPLATE_TOKENS
    probe = [*prefix.messages, ChatMessage(role="user", content=SIMPLE.cached)]
    shaped = api.summary_body(data, probe, max_tokens)
    if shaped is None:
        return None
    # The answer may take more than the summary's own (thinking's tokens).
    if prefix.tokens + asked + shaped[1] + window // _MARGIN_SHARE > window:
        return None
    url = upstream_url(base_url, PATHS[kind], b"")
    return CachedAsk(kind, url, data, prefix.messages, api.summary_body)
