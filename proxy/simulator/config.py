"""Simulator settings (YAML) and the per-model profile a request is judged by.

Every key is optional::

    models:                  # exact name first, then the first fnmatch glob, else `default`
      - {match: "sim-small", context_window: 4096, max_output_tokens: 1024}
    default: {context_window: 32768, max_output_tokens: 4096, tokenizer: cl100k_base}
    error_format: openai     # openai | vllm | vllm_legacy | anthropic | llamacpp | gateway413
    listing: vllm            # how GET /v1/models describes each model: vllm | openrouter |
                             # llamacpp (and GET /props) | openai (ids only): listing.py
    strict_alternation: false
    stream: {chunk_chars: 16, delay_ms: 0, first_byte_delay_ms: 0}
    reply_tokens: 24
    latency_ms: 0
    summary_latency_ms: null # summaries (X-Compaction-Purpose: summarize); null: latency_ms
    slots: null              # chat completions served at once (llama.cpp -np); more queue
    tokens_per_s: null       # output tokens generated a second (a slow CPU); null: at once
    prompt_tokens_per_s: null  # with slots: uncached prompt tokens read a second; null: at once
    recording: {max_requests: 10000, max_bytes: 134217728}   # for GET /_sim/requests
    prompt_cache: {ttl_s: 600, min_tokens: 1024, increment: 128}  # ttl_s 0: off (prompt_cache.py)
    # Anthropic's (anthropic_cache.py): 5 minutes, 1 hour for a breakpoint's ttl: "1h"
    #   anthropic_ttl_s: 300, anthropic_long_ttl_s: 3600

A model rule may override ``tokenizer``, ``error_format`` and ``strict_alternation``,
say how it counts tool definitions (``tool_format``) and how the model summarizes:
``summary_style`` (ideal | realistic | plain, or a weak model's echo | short |
cut_off | parrot: replies.py) and ``summary_forgets``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.config_file import describe_invalid, read_yaml_mapping
from proxy.errors import ConfigError

ErrorFormat = Literal["openai", "vllm", "vllm_legacy", "anthropic", "llamacpp", "gateway413"]
ERROR_FORMATS: tuple[str, ...] = get_args(ErrorFormat)
SummaryStyle = Literal["ideal", "realistic", "plain", "echo", "short", "cut_off", "parrot"]
ToolFormat = Literal["json", "hermes"]
Listing = Literal["vllm", "openrouter", "llamacpp", "openai"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRule(_Section):
    match: str
    context_window: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    tokenizer: str | None = None
    error_format: ErrorFormat | None = None
    strict_alternation: bool | None = None
    # Count this many times our tokenizer's count: a provider whose template or
    # tokenizer adds tokens the client cannot see.
    token_scale: float = Field(default=1.0, gt=0)
    # How this model writes summaries (replies.py): "ideal" always fits every fact;
    # "realistic" writes prose first and the facts last, and is cut off at max_tokens;
    # "plain" keeps every fact in prose and writes none of the requested headings;
    # weak models: "echo" copies its prompt, "short" answers a line, "cut_off" always
    # runs to max_tokens.
    summary_style: SummaryStyle = "ideal"
    # Forget every Nth fact (in key order) when summarizing; 0 forgets none.
    summary_forgets: int = Field(default=0, ge=0)
    # How tool definitions count (counting.py): "json", their JSON text; "hermes", as
    # Qwen2.5's and Hermes' chat templates render them (llama.cpp, vLLM serving those).
    tool_format: ToolFormat = "json"


class ModelDefaults(_Section):
    context_window: int = Field(default=32768, gt=0)
    max_output_tokens: int = Field(default=4096, gt=0)
    tokenizer: str = "cl100k_base"


class StreamConfig(_Section):
    chunk_chars: int = Field(default=16, gt=0)
    delay_ms: float = Field(default=0, ge=0)
    first_byte_delay_ms: float = Field(default=0, ge=0)


class RecordingConfig(_Section):
    max_requests: int = Field(default=10_000, ge=0)  # 0 turns recording off
    max_bytes: int = Field(default=128 * 1024 * 1024, ge=0)


class PromptCacheConfig(_Section):
    # OpenAI's rules (prompt_cache.py): prompts of 1024 tokens or more, hits in steps of 128.
    ttl_s: float = Field(default=600, ge=0)  # how long a prefix stays cached; 0: never
    min_tokens: int = Field(default=1024, gt=0)
    increment: int = Field(default=128, gt=0)
    # Anthropic's lifetimes (anthropic_cache.py): a breakpoint's default, and ttl "1h"'s.
    anthropic_ttl_s: float = Field(default=300, gt=0)
    anthropic_long_ttl_s: float = Field(default=3600, gt=0)


class SimulatorConfig(_Section):
    models: tuple[ModelRule, ...] = ()
    default: ModelDefaults = ModelDefaults()
    error_format: ErrorFormat = "openai"
    # What GET /v1/models says of each listed model's window (listing.py): as vLLM does
    # (max_model_len), OpenRouter (context_length, top_provider), llama.cpp (only the
    # trained length there; the window it serves in GET /props) or OpenAI (nothing).
    listing: Listing = "vllm"
    strict_alternation: bool = False
    stream: StreamConfig = StreamConfig()
    reply_tokens: int = Field(default=24, gt=0)
    latency_ms: float = Field(default=0, ge=0)
    # A summarizer slower (or faster) than the chat model; None: latency_ms.
    summary_latency_ms: float | None = Field(default=None, ge=0)
    # Chat completions (summaries included) answered at once, as llama.cpp's -np: one
    # beyond them queues for a slot (counted: slot_waits). None: no limit.
    slots: int | None = Field(default=None, ge=1)
    # How fast replies are written, in output tokens a second, as a model on a loaded CPU
    # writes them: a reply (a summary too) of N tokens takes N / tokens_per_s seconds more,
    # in its slot, after the latency. None: written at once.
    tokens_per_s: float | None = Field(default=None, gt=0)
    # How fast a slot reads a chat prompt's tokens that its cache does not hold (with
    # slots set), as llama.cpp does: each slot keeps the prompt it read last, and a new one
    # reuses only their longest common prefix (a message inserted early, a summary's
    # handoff, makes everything after it read again). None: prompts are read at once.
    prompt_tokens_per_s: float | None = Field(default=None, gt=0)
    recording: RecordingConfig = RecordingConfig()
    prompt_cache: PromptCacheConfig = PromptCacheConfig()

    def tokenizers(self) -> list[str]:
        """Every tokenizer a request could need, so all load once at start-up."""
        names = [self.default.tokenizer]
        names += [r.tokenizer for r in self.models if r.tokenizer is not None]
        return list(dict.fromkeys(names))

    def listed_models(self) -> list[str]:
        """Model names for ``GET /v1/models``: the rules that are not globs."""
        return [r.match for r in self.models if not any(c in r.match for c in "*?[")]


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What the simulator enforces for one model name (before header overrides)."""

    name: str
    context_window: int
    max_output_tokens: int
    tokenizer: str
    error_format: ErrorFormat
    strict_alternation: bool
    token_scale: float = 1.0
    summary_style: SummaryStyle = "ideal"
    summary_forgets: int = 0
    tool_format: ToolFormat = "json"


def resolve_model(config: SimulatorConfig, name: str) -> ModelProfile:
    """First rule matching ``name`` exactly, else the first glob, else the defaults."""
    rule = next((r for r in config.models if r.match == name), None) or next(
        (r for r in config.models if fnmatchcase(name, r.match)), None
    )
    d = config.default
    if rule is None:
        return ModelProfile(
            name,
            d.context_window,
            d.max_output_tokens,
            d.tokenizer,
            config.error_format,
            config.strict_alternation,
        )
    return ModelProfile(
        name=name,
        context_window=rule.context_window or d.context_window,
        max_output_tokens=rule.max_output_tokens or d.max_output_tokens,
        tokenizer=rule.tokenizer or d.tokenizer,
        error_format=rule.error_format or config.error_format,
        strict_alternation=(
            config.strict_alternation
            if rule.strict_alternation is None
            else rule.strict_alternation
        ),
        token_scale=rule.token_scale,
        summary_style=rule.summary_style,
        summary_forgets=rule.summary_forgets,
        tool_format=rule.tool_format,
    )


def load_simulator_config(path: str | Path | None) -> SimulatorConfig:
    """Read the simulator YAML; ``None`` gives the defaults. Raises ConfigError."""
    if path is None:
        return SimulatorConfig()
    raw = read_yaml_mapping(path, "simulator config")
    try:
        return SimulatorConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"simulator config {path}: {describe_invalid(exc)}") from exc
