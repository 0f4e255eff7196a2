"""The per-model table: which window, output reserve and tokenizer a model gets.

Matching is by exact name first, then the first glob (``fnmatch``) in file
order, then the maintained model registry (``core/registry.py``), then
``default_model``. Each result says where its figures came from (``source``).
Results are cached per model name: the table is fixed for the life of the
process, so the request path only does a cache lookup.

What the provider says of its own models (``/v1/models``, ``/props``: asked in the
background by ``upstream/discovery.py``, per credential scope) comes between a
``models:`` entry and the registry: ``described`` puts it over a table result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Literal

from proxy.core.descriptions import Described
from proxy.core.encodings import Encoder, warn_inexact
from proxy.core.registry import Registry

if TYPE_CHECKING:  # for annotations: the table reads the settings it is built from
    from proxy.config import Settings

# Model families whose tokenizer we know; everything else counts with
# cl100k_base, the closest widely shared vocabulary (open models' own
# tokenizers are not tiktoken-compatible, so that is an estimate anyway).
_FAMILY_TOKENIZERS = (
    (
        ("gpt-4o*", "gpt-4.1*", "gpt-4.5*", "gpt-5*", "o1*", "o3*", "o4*", "chatgpt-4o*"),
        "o200k_base",
    ),
    (("gpt-4*", "gpt-3.5*", "text-embedding-3*"), "cl100k_base"),
)
DEFAULT_TOKENIZER = "cl100k_base"
# Model names come from clients: bounded in entries, and in bytes because parsing
# refuses a name over server.max_model_bytes (at most ~5 MB at the 512-byte default).
_CACHE_LIMIT = 10_000
# Where a model's figures came from: a models: entry, the provider's own description of
# the model (``described``), the registry, or default_model; "learned" once an upstream's
# overflow error narrowed the window.
ModelSource = Literal["config", "provider", "registry", "default", "learned"]
SOURCES: tuple[ModelSource, ...] = ("config", "provider", "registry", "default", "learned")


def openai_family(model: str) -> bool:
    """Whether ``model`` names one of OpenAI's own model families."""
    return any(fnmatchcase(model, p) for patterns, _ in _FAMILY_TOKENIZERS for p in patterns)


def default_tokenizer(model: str) -> str:
    for patterns, name in _FAMILY_TOKENIZERS:
        if any(fnmatchcase(model, p) for p in patterns):
            return name
    return DEFAULT_TOKENIZER


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    name: str
    context_window: int
    max_output_tokens: int
    tokenizer: str
    matched: str  # the rule that matched: a pattern, or "default"
    precompact: bool = True  # background pre-compaction (precompact.py) for this model
    recall_tool: bool = True  # the recall tool may be added (compaction/recall_tool.py)
    slots: int | None = None  # requests its server answers at once; None: not said
    # Count tool definitions as an open model's chat template renders them (tokens.py):
    # every model outside OpenAI's families, which count them their own way.
    templated_tools: bool = False
    source: ModelSource = "config"

    @property
    def single_slot(self) -> bool:
        """Whether its server answers one request at once: a turn sent while the proxy's
        own summary runs there would wait for it (compaction/busy.py)."""
        return self.slots == 1

    @property
    def keeps_late_summaries(self) -> bool:
        """Whether a summary past its turn's deadline may finish in the background: not
        without background summaries (``precompact: false``), nor on one slot, where the
        next turn would queue behind it (compaction/turn_deadline.py)."""
        return self.precompact and not self.single_slot


class ModelTable:
    def __init__(self, settings: Settings, registry: Registry | None = None) -> None:
        self._specs = settings.models
        self._default = settings.default_model
        self.registry = registry or Registry.empty()
        # Told of each name the first time it is resolved (and again once forgotten): the
        # caller counts and warns there, so a request resolved from the cache costs nothing.
        self.on_resolved: Callable[[ResolvedModel], None] | None = None
        # Least recently used first; only ever used on the event loop, so no lock. A plain
        # dict: cachetools' LRUCache took five Python calls a hit (issue 27).
        self._cache: dict[str, ResolvedModel] = {}
        # Stand-ins for encodings not on disk that no configured model names: said once,
        # when a request first resolves to one, not at start-up for every deployment.
        self._unannounced: dict[str, Encoder] = {}

    def resolve(self, model: str) -> ResolvedModel:
        cache = self._cache
        hit = cache.pop(model, None)
        if hit is not None:
            cache[model] = hit  # to the end: the most recently used
            return hit
        while len(cache) >= _CACHE_LIMIT:
            del cache[next(iter(cache))]  # the least recently used
        hit = cache[model] = self._resolve(model)
        if self.on_resolved is not None:
            self.on_resolved(hit)
        if self._unannounced:
            self._announce(hit.tokenizer)
        return hit

    def entry_of(self, model: str) -> str:
        """The configured entry (its ``match``) ``model`` resolves to, else ``other``: a
        closed set, for a metric's label (never the client's own name)."""
        hit = self.resolve(model)
        return hit.matched if hit.source == "config" else "other"

    def announce_on_first_use(self, encoders: dict[str, Encoder]) -> None:
        """Warn about an inexact encoder among ``encoders`` (loaded quietly) the first
        time a model resolves to it."""
        self._unannounced = {name: enc for name, enc in encoders.items() if not enc.exact}

    def _announce(self, tokenizer: str) -> None:
        encoder = self._unannounced.pop(tokenizer, None)
        if encoder is not None:
            warn_inexact(encoder)

    def _resolve(self, model: str) -> ResolvedModel:
        spec = next((s for s in self._specs if s.match == model), None) or next(
            (s for s in self._specs if fnmatchcase(model, s.match)), None
        )
        if spec is not None:
            return ResolvedModel(
                name=model,
                context_window=spec.context_window,
                max_output_tokens=spec.max_output_tokens,
                tokenizer=spec.tokenizer or default_tokenizer(model),
                matched=spec.match,
                precompact=spec.precompact,
                recall_tool=spec.recall_tool,
                slots=spec.slots,
                templated_tools=not openai_family(model),
            )
        # The provider's own word on its model comes next, per credential scope, over what
        # this returns (``described``), never here: the table is the same for everyone.
        listed = self.registry.lookup(model)
        if listed is not None:
            window = listed.context_window
            # Some hosts list the whole window as the output limit: a reserve that large
            # would leave no room for input, so at most half the window is reserved.
            output = min(listed.max_output_tokens or self._default.max_output_tokens, window // 2)
            return ResolvedModel(
                name=model,
                context_window=window,
                max_output_tokens=max(output, 1),
                tokenizer=self._default.tokenizer or default_tokenizer(model),
                matched="registry",
                precompact=self._default.precompact,
                recall_tool=self._default.recall_tool,
                slots=self._default.slots,
                templated_tools=not openai_family(model),
                source="registry",
            )
        return ResolvedModel(
            name=model,
            context_window=self._default.context_window,
            max_output_tokens=self._default.max_output_tokens,
            tokenizer=self._default.tokenizer or default_tokenizer(model),
            matched="default",
            precompact=self._default.precompact,
            recall_tool=self._default.recall_tool,
            slots=self._default.slots,
            templated_tools=not openai_family(model),
            source="default",
        )

    def tokenizers(self) -> set[str]:
        """Every tokenizer the table can name, to load at start-up."""
        names = self.configured_tokenizers()
        names.update(n for _, n in _FAMILY_TOKENIZERS)
        return names

    def configured_tokenizers(self) -> set[str]:
        """The tokenizers the configuration names: its model rules' and the default's.
        (A model name no rule matches may still pick its family's: ``tokenizers``.)"""
        names = {s.tokenizer or default_tokenizer(s.match) for s in self._specs}
        names.add(self._default.tokenizer or DEFAULT_TOKENIZER)
        return names


def described(model: ResolvedModel, told: Described) -> ResolvedModel:
    """``model`` (a registry's or the default's: a ``models:`` entry is never overridden)
    with the window, output limit and slots its provider states (``default_model.slots``,
    when set, over the provider's). As for the registry's figures, at most half the window
    is reserved for output."""
    reserve = min(told.output or model.max_output_tokens, told.window // 2)
    return replace(
        model,
        context_window=told.window,
        max_output_tokens=max(reserve, 1),
        slots=model.slots or told.slots,
        matched="provider",
        source="provider",
    )
