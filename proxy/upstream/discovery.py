"""What the upstream says about its own models, asked in the background and kept.

A model no ``models:`` entry names is planned against the registry's window or the
default's (an entry without ``slots`` takes only the server's slot count from here); the
server that serves it often knows better (a vLLM started with
``--max-model-len 8192``, a llama.cpp server with ``-c 16384``, a gateway's own
models). So the first request of a model the configuration does not name starts one
ask of the upstream, in a task of its own: ``GET {base}/models`` (vLLM's
``max_model_len``, OpenRouter's ``context_length``...), then, for what the listing left
without a window, llama.cpp's ``GET /props`` (at the server's root) and LiteLLM's
``GET {base}/model/info``; ``core/descriptions.py`` reads the answers. Requests never
wait for it: each uses what is known when it arrives, and a later one the figures the
upstream gave (``Services.known_model``: ``models:`` entry, then these, then the registry,
then ``default_model``).

One ask covers every model of its scope, and at most one is in flight per scope (single
flight); it is bounded in time (``_ASK_S`` for all its calls) and in size (each body at
most ``MAX_BODY_BYTES``, figures bounded in ``core/descriptions.py``). What it learned is
kept for ``upstream.model_info_ttl_s``, then asked again while the old figures still
serve; a failed ask is retried after ``_RETRY_S``.

Scoped as the upstream scopes what a caller may see: with ``upstream.api_key`` set every
request asks with that key, so one description serves all; without it each caller's own
credential asks, and what the upstream told one tenant (its fine-tunes, a gateway's
per-key aliases) is that tenant's only. Bounded: ``_SCOPES`` scopes, ``_HELD`` models in
all, the least recently asked dropped first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from proxy.config import Settings
from proxy.core.descriptions import (
    Described,
    read_listing,
    read_model_info,
    read_props,
)
from proxy.core.models import ResolvedModel, described
from proxy.errors import ProxyError
from proxy.observe.metrics import Metrics
from proxy.upstream.client import UpstreamClient
from proxy.upstream.headers import HeaderPolicy
from proxy.upstream.seam import Upstream

log = logging.getLogger("proxy.discovery")

Headers = Sequence[tuple[bytes, bytes]]
# The headers of the request being served (set by its route, app.py): the credential an
# ask it starts goes with. Unset outside a route: nothing is asked then, but with a key
# of the proxy's own.
ASKING: ContextVar[Headers | None] = ContextVar("proxy_asking", default=None)

_ASK_S = 10.0  # every call of one ask, together
_RETRY_S = 60.0  # after a failed ask (an upstream down, or too slow)
MAX_BODY_BYTES = 4 * 1024 * 1024  # a listing of thousands of models is well below this
_SCOPES = 1024
_HELD = 50_000  # models described, in every scope together
_RESOLVED = 4096  # per scope: names resolved over its figures (llama.cpp's serve any name)
# The proxy's own question, marked as its summaries are (x-compaction-purpose), so the
# upstream's logs (and the tests' upstreams) tell it from a client's.
PURPOSE = (b"x-compaction-purpose", b"discover")
_ACCEPT = [(b"accept", b"application/json"), (b"accept-encoding", b"identity"), PURPOSE]


@dataclass(slots=True)
class _Scope:
    """What one scope's upstream said, and when to ask it again."""

    told: dict[str, Described] = field(default_factory=dict)
    # The one window a single-model server (llama.cpp) serves whatever the name asked.
    server: Described | None = None
    expires: float = 0.0  # 0: never answered
    task: asyncio.Task[None] | None = None  # the ask in flight
    resolved: dict[str, ResolvedModel] = field(default_factory=dict)


class ModelDiscovery:
    def __init__(
        self,
        settings: Settings,
        client: Upstream,
        headers: HeaderPolicy,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        up = settings.upstream
        self._client = client
        self._headers = headers
        self._metrics = metrics
        self._clock = clock
        self._base = up.base_url.rstrip("/")
        self._root = _root(self._base)
        self._ttl = up.model_info_ttl_s
        self._shared = bool(up.api_key.get_secret_value())
        # Oldest asked first; used on the event loop only.
        self._scopes: dict[str, _Scope] = {}
        self._held = 0
        self._said = False  # the first description is logged at info, later ones at debug

    def described(self, model: ResolvedModel, tenant: str) -> ResolvedModel:
        """``model`` with the figures its upstream gave, for ``tenant``'s scope, when it
        gave some (of a ``models:`` entry's, which keeps its own figures, only the slots it
        leaves unset); else ``model`` as it is. Asks (in the background) when its scope
        was never asked or its figures are due again."""
        scope = "" if self._shared else tenant
        entry = self._scopes.get(scope)
        if entry is None or (entry.expires <= self._clock() and entry.task is None):
            entry = self._ask(scope, entry)
            if entry is None:
                return model
        hit = entry.resolved.get(model.name)
        if hit is not None:
            return hit
        told = entry.told.get(model.name) or entry.server
        if told is None:
            return model
        if len(entry.resolved) >= _RESOLVED:
            entry.resolved.clear()
        if model.source == "config":  # the entry's window and limit; the server's slots
            hit = replace(model, slots=told.slots) if told.slots else model
        else:
            hit = described(model, told)
            self._metrics.models.resolved.labels(source="provider").inc()
        entry.resolved[model.name] = hit
        return hit

    def _ask(self, scope: str, entry: _Scope | None) -> _Scope | None:
        if self._ttl <= 0:
            return entry
        asking = ASKING.get()
        if asking is None and not self._shared:
            return entry  # no caller's credential to ask with
        if entry is None:
            self._drop_oldest(len(self._scopes) - _SCOPES + 1)
            entry = _Scope()
        else:
            del self._scopes[scope]  # to the end: the most recently asked
        self._scopes[scope] = entry
        auth = self._headers.outgoing_and_auth(asking or ())[1]
        entry.task = asyncio.create_task(self._discover(entry, auth))
        entry.task.add_done_callback(_reported)
        return entry

    async def _discover(self, entry: _Scope, auth: Headers) -> None:
        """One ask, its answer kept in ``entry`` (a failure keeps what it had)."""
        # Due again soon whatever ends this ask (a failure, a defect): never once a request.
        entry.expires = self._clock() + min(self._ttl, _RETRY_S)
        try:
            async with asyncio.timeout(_ASK_S):
                told, server = await self._answers(list(auth))
        except (ProxyError, TimeoutError) as exc:
            log.info("the upstream's models were not described (%s)", type(exc).__name__)
            outcome = "failed"
        else:
            self._held += len(told) - len(entry.told)
            entry.told, entry.server, entry.resolved = told, server, {}
            entry.expires = self._clock() + self._ttl
            outcome = "described" if told or server else "silent"
            if told or server:
                self._note(told, server)
        finally:
            entry.task = None  # cancelled too (aclose): never left "in flight"
        self._metrics.models.discoveries.labels(outcome=outcome).inc()
        self._drop_oldest(0)

    async def _answers(self, auth: Headers) -> tuple[dict[str, Described], Described | None]:
        listing = read_listing(await self._get(f"{self._base}/models", auth) or b"")
        told = dict(listing.described)
        server = None
        # llama.cpp serves one model (whatever name a request gives) and says its window
        # only in /props; a server with no listing at all may be one too.
        if listing.llamacpp or (listing.listed <= 1 and not told):
            server = read_props(await self._get(f"{self._root}/props", auth) or b"")
            if server is not None and listing.listed > 1:
                server = None  # a router of several models: /props is not each one's
        elif listing.listed > len(told):  # some listed without a window: LiteLLM's own
            info = read_model_info(await self._get(f"{self._base}/model/info", auth) or b"")
            told.update((name, d) for name, d in info.items() if name not in told)
        return told, server

    async def _get(self, url: str, auth: Headers) -> bytes | None:
        """The body of a 200 answer to ``GET url``, at most ``MAX_BODY_BYTES``; else None."""
        response = await self._client.send("GET", url, [*auth, *_ACCEPT], None)
        try:
            if response.status_code != 200:
                return None
            return await response.aread_at_most(MAX_BODY_BYTES)
        finally:
            await response.aclose()

    def _note(self, told: dict[str, Described], server: Described | None) -> None:
        level = logging.DEBUG if self._said else logging.INFO
        self._said = True
        if server is not None:
            log.log(level, "the upstream serves a window of %d tokens (/props)", server.window)
        if told:
            log.log(level, "the upstream describes the windows of %d of its models", len(told))

    def _drop_oldest(self, count: int) -> None:
        """Drop ``count`` scopes (and more while too many models are held), the least
        recently asked first; never one whose ask is in flight."""
        for scope in list(self._scopes):
            if count <= 0 and self._held <= _HELD:
                return
            entry = self._scopes[scope]
            if entry.task is not None:
                continue
            del self._scopes[scope]
            self._held -= len(entry.told)
            count -= 1

    async def settled(self) -> None:
        """Once every ask in flight has ended (check-config waits for its one)."""
        await asyncio.gather(*(e.task for e in self._scopes.values() if e.task is not None))

    async def aclose(self) -> None:
        """Cancel the asks in flight (the upstream client closes after this)."""
        tasks = [e.task for e in self._scopes.values() if e.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def described_now(settings: Settings, models: Sequence[ResolvedModel]) -> list[ResolvedModel]:
    """``models`` as the upstream describes them, asked once and waited for (``check-config
    --ask-upstream``, never a request), with ``upstream.api_key`` or, without one, no
    credential (a local server's listing needs none)."""
    client = UpstreamClient(settings)
    asking = ASKING.set(())
    try:
        discovery = ModelDiscovery(settings, client, HeaderPolicy(settings), Metrics.create())
        # As a request resolves (Services.resolved_model): an entry that sets its slots
        # is the entry alone; one that leaves them unset takes the server's count.
        asked = [m for m in models if m.source != "config" or m.slots is None]
        for model in asked:
            discovery.described(model, "")  # the first starts the one ask
        await discovery.settled()
        return [discovery.described(m, "") if m in asked else m for m in models]
    finally:
        ASKING.reset(asking)
        await client.aclose()


def _reported(task: asyncio.Task[None]) -> None:
    """Log what an ask raised beyond the failures it expects (a defect), once."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("asking the upstream about its models failed", exc_info=exc)


def _root(base: str) -> str:
    """The server's root, where llama.cpp serves ``/props``: ``base`` without a final
    ``/v1``."""
    return base[: -len("/v1")] if base.endswith("/v1") else base
