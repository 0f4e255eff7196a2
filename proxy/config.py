"""Settings: one YAML file, environment overrides, validated once at start-up.

Precedence, highest first: values passed to ``Settings(...)`` (tests), environment
variables (``PROXY_`` prefix, ``__`` between nested keys, e.g. ``PROXY_STORE__URL``), the
YAML file, then the defaults below. Strings in the YAML may reference the environment as
``${VAR}`` or ``${VAR:-default}`` so secrets stay out of the file (config_file.py reads
it). Unknown keys are errors that name the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from proxy import config_file
from proxy.config_file import YamlSource, describe_invalid, read_config_file, yaml_values
from proxy.errors import ConfigError
from proxy.pricing import PriceRule
from proxy.redact import redact_url
from proxy.tenants import MAX_TENANTS, Mode, TenantPolicy, check_tenants


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    admin_key: SecretStr = SecretStr("")
    tenant_id_secret: config_file.TenantSecret = SecretStr("")  # README "Tenant ids"
    legacy_tenant_ids: bool = True  # tenants: entries naming a legacy id still match it
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # false: /readyz stays 200 while the store fails (down, read-only, full...: the
    # proxy degrades and keeps serving); true: it answers 503, out of rotation.
    ready_requires_store: bool = False
    # Callers must send a credential (Authorization, api-key or x-api-key): it is what
    # scopes their sessions. None: required exactly when upstream.api_key is set, since
    # keyless callers would otherwise all share one tenant under the proxy's own key.
    require_client_key: bool | None = None
    # A chat request with more messages than this gets a 400 (planning is linear, but
    # an unbounded history is unbounded work).
    max_messages: int = Field(50_000, gt=0)
    # A longer model name (UTF-8 bytes) gets a 400: per-process tables are keyed by it, so
    # this bounds their bytes. Far above any real id (hf.co/org/X-GGUF:Q4_K_M, an ARN).
    max_model_bytes: int = Field(512, ge=64)
    # Slow or hostile clients: the request line and headers must arrive within header_timeout_s
    # and total at most max_header_bytes; a request body may stall body_timeout_s between reads.
    header_timeout_s: float = Field(10.0, gt=0)
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    body_timeout_s: float = Field(60.0, gt=0)
    # An idle client connection is closed after this: longer than clients and load balancers
    # keep idle connections (httpx 5 s, aiohttp 15 s, AWS ALB 60 s), so they close first (a
    # server that closes first races their next request on it: a 502 at a load balancer).
    keepalive_timeout_s: int = Field(75, gt=0)
    # ...and, once it has been arriving for body_timeout_s, must average at least this
    # (time the proxy itself is not reading does not count): a byte every few seconds
    # never stalls, yet would hold a connection for ever. 0: no minimum.
    min_body_rate_bytes_s: int = Field(256, ge=0)
    # On SIGTERM /readyz answers 503 at once, but the proxy keeps accepting for drain_delay_s,
    # so a load balancer (Kubernetes endpoints) stops routing here before connections are
    # refused; then requests in flight have shutdown_timeout_s to finish, the rest is ended.
    drain_delay_s: float = Field(0.0, ge=0)
    shutdown_timeout_s: float = Field(30.0, ge=0)
    workers: int = Field(1, ge=1)  # processes on the port; each its own memory:// store
    # Request bodies this worker holds at once, until each request ends; one beyond gets
    # a 503 with Retry-After, unread. None: 4 x max_body_bytes, never below max_body_bytes.
    max_inflight_body_bytes: int | None = Field(None, gt=0)
    max_client_connections: int = Field(2048, gt=0)  # per worker; one beyond: a 503, closed
    # Each process re-reads the config file's `tenants` on SIGHUP and, checked this often,
    reload_poll_s: float = Field(2.0, ge=0)  # when it changes (0: never): README "Per-tenant"


class UpstreamSettings(_Section):
    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr = SecretStr("")  # empty: forward the caller's own Authorization header
    timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    # The most one upstream call may take from send to its last byte, streams included
    # (checked every total / 8 s, 10 ms to 1 s: upstream/deadline.py).
    total_timeout_s: float = Field(1800.0, gt=0)
    max_connections: int = Field(1000, gt=0)
    # A pooled upstream connection idle this long is closed rather than reused. Below
    # the upstream's own idle timeout (5 s in uvicorn, so vLLM and SGLang, and in
    # llama.cpp's server), or a request sent as the upstream closes it fails with a 502.
    keepalive_timeout_s: float = Field(4.0, gt=0)
    # What the upstream says of its models (/v1/models, llama.cpp's /props: discovery.py) is
    model_info_ttl_s: float = Field(3600.0, ge=0)  # asked again this often; 0: never asked
    # The API the summary calls use: "chat" (/chat/completions), "responses" (/responses)
    # or "messages" (Anthropic's /messages), for an upstream that serves only that API.
    summarizer_api: Literal["chat", "responses", "messages"] = "chat"
    # OpenAI's compaction contract (compaction_trigger, /responses/compact): "passthrough"
    # to the upstream, "proxy" compacts here; "auto": passthrough for api.openai.com only.
    compaction: Literal["auto", "passthrough", "proxy"] = "auto"
    # With api_key set, the caller's credential and origin headers (x-api-key, api-key, OpenAI-
    # Organization/-Project, Forwarded, X-Forwarded-*, X-Real-IP) stay here, but those named here
    forward_client_headers: list[str] = []  # (Authorization never goes)

    @model_validator(mode="after")
    def _check_url(self) -> UpstreamSettings:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url is not http:// or https://: {redact_url(self.base_url)!r}")
        return self


class StoreSettings(_Section):
    SCHEMES: ClassVar = "memory, unix, redis[s], redis[s]+cluster, redis[s]+sentinel"
    url: str = Field("memory://", repr=False)  # may hold a password: show redact_url(url)
    ttl_s: int = Field(7 * 24 * 3600, gt=0)
    prefix: str = Field("cp", pattern="^[^{}]*$")  # to share one Redis; no {}: store/keys.py
    max_sessions: int = Field(100_000, gt=0)  # in memory://, least recently used out first
    # ...and this many of one tenant's, its own oldest dropped first: none crowds others out.
    max_sessions_per_tenant: int = Field(10_000, gt=0)
    # Fernet keys (`Fernet.generate_key()`); snapshots in Redis are encrypted with the first
    # and readable with any (rotation). Needs the `encryption` extra. Empty: plain JSON.
    encryption_keys: Annotated[list[SecretStr], AfterValidator(config_file.fernet_keys)] = []
    # true: no snapshot read or written in plaintext; a remote store needs encryption_keys.
    require_encryption: bool = False
    # A remote store's calls, connects too, give up after timeout_s (raise it across zones
    # or with TLS); a call finding all max_connections (per process, per cluster node) busy
    timeout_s: float = Field(0.25, gt=0, le=30)
    max_connections: int = Field(100, gt=0, le=10_000)
    pool_wait_s: float = Field(2.0, gt=0, le=60)  # waits this long for one, then fails

    @model_validator(mode="after")
    def _check_url(self) -> StoreSettings:
        url = redact_url(self.url)
        if not re.match(r"(memory|unix|rediss?(\+cluster|\+sentinel)?)://", self.url):
            raise ValueError(f"unsupported store url {url!r} (schemes: {self.SCHEMES})")
        remote = not self.url.startswith("memory://")
        if self.require_encryption and remote and not self.encryption_keys:
            raise ValueError(f"require_encryption is set and {url} has no encryption_keys")
        return self


class SessionSettings(_Section):
    header: str = "X-Session-Id"
    # Body fields that name the session when the header does not, after prompt_cache_key
    # (always honoured). Off by default: "user" often names a person, not a session.
    body_fields: list[Literal["metadata.session_id", "user"]] = []
    # Snapshots kept per derived session id (identical openings each keep their own) and
    # per named one (several conversations under one name; a rewind reuses an older one).
    derived_slots: int = Field(4, ge=1, le=32)
    explicit_slots: int = Field(4, ge=1, le=32)
    # A longer session name (header, prompt_cache_key, body field; UTF-8 bytes) gets a 400.
    max_name_bytes: int = Field(1024, ge=64)


class CompactionSettings(_Section):
    enabled: bool = True  # deprecated (__main__ warns): false is mode off
    mode: Mode | None = None  # None: enabled's (docs/how-it-works.md "Shadow mode")
    shadow_summarize: bool = False  # in shadow, also run the summaries (kept apart)
    trigger_ratio: float = Field(0.8, gt=0, le=1)
    target_ratio: float = Field(0.5, gt=0, le=1)
    summarizer_model: str | None = None
    summary_max_tokens: int = Field(2000, gt=0)
    # ...and at most this share of the chat model's window (raise it for small windows).
    summary_budget_ratio: float = Field(0.15, gt=0, le=0.5)
    summary_timeout_s: float = Field(60.0, gt=0)
    # An inline summary delays its turn at most this long (0: none; README "A single-slot
    # server"): as a turn waits for another's; half the 60 s gateways allow (nginx), answer due.
    summary_deadline_s: float = Field(30.0, ge=0)
    summarizer_context_window: int | None = Field(None, gt=0)  # if not the request's model
    # The most the summarizer model can write in one answer, if below the summary
    # budget. Not the chat model's max_output_tokens: that is the reply reserve.
    summarizer_max_output_tokens: int | None = Field(None, gt=0)
    # Most summarizer calls (so windows of tokens) of one compaction, retries included: a
    # span that needs more keeps its newest chunks, the oldest left out behind a marker.
    max_summary_calls: int = Field(16, ge=2)
    # "cached": the summary asked as the live request cut after the span, the instruction
    # last, so the provider's prompt cache serves it (summary_prefix.py); "transcript": a
    # quoted transcript under the proxy's own instructions (where "cached" cannot go too).
    summary_prompt: Literal["cached", "transcript"] = "cached"
    # "user": a user/assistant handoff pair; "system": the (steerable) summary, system authority.
    summary_role: Literal["user", "system"] = "user"
    # Most values restored into a summary or quoted in a trimmed view's digest, with role.
    restored_identifiers_max: int = Field(64, ge=0, le=1000)
    # Verbatim after the leading system/developer messages: README "Pinned user messages".
    pin_first_user: bool = False
    pin_user_prefixes: list[Annotated[str, Field(min_length=1)]] = []
    min_tail_messages: int = Field(4, ge=1)
    elide_min_tokens: int = Field(400, ge=1)
    wait_for_summary_s: float = Field(30.0, ge=0)  # a session's requests wait for its summary
    # Background pre-compaction (precompact.py): past this share of the window (below
    # trigger_ratio) a session is compacted after the answer, so the turn that crosses the
    # trigger finds a snapshot ready; down to target_ratio * precompact_ratio / trigger_ratio.
    precompact_ratio: float | None = Field(0.6, ge=0, lt=1)  # None or 0: off
    cache_aware: bool = False  # hold a cached view until the trigger (compaction/held.py)
    precompact_concurrency: int = Field(2, ge=1)  # background summaries at once, per process
    # ...of which one tenant keeps this many while another wants one (its newest run over it
    # is cancelled for a tenant under it). None: half of precompact_concurrency, rounded up.
    precompact_per_tenant: int | None = Field(None, ge=1)
    precompact_retry_s: float = Field(60.0, ge=0)  # after a background run failed or idle
    precompact_idle_s: float = Field(2.0, ge=0)  # one slot: no turn this long, then summarize
    force_interval_s: float = Field(30.0, ge=0)
    # After a failed or cut-off summary, none for the session for summary_backoff_s (its turns
    # trimmed), doubling per failure in a row up to summary_backoff_max_s, or 4x its time.
    summary_backoff_s: float = Field(30.0, ge=0)
    summary_backoff_max_s: float = Field(900.0, ge=0)
    recover_overflow: bool = True  # the last line of defence: on even with enabled: false
    learned_window_ttl_s: float = Field(24 * 3600, gt=0)
    # A window learned from one caller's overflow error is that caller's at once, everyone's
    # once this many tenants report it, lowered once per learned_window_interval_s, by half at most.
    learned_window_quorum: int = Field(2, ge=1)
    learned_window_interval_s: float = Field(600.0, ge=0)
    recall_budget_ratio: float = Field(0.1, ge=0, le=0.5)  # excerpts (recall.py); 0: off
    recall_tool_rounds: int = Field(0, ge=0, le=8)  # its calls answered a turn (recall_tool.py)

    @property
    def effective_mode(self) -> Literal["on", "shadow", "off"]:
        if self.mode is not None:
            return self.mode
        return "on" if self.enabled else "off"

    @model_validator(mode="after")
    def _check_ratios(self) -> CompactionSettings:
        if not self.enabled and self.mode not in (None, "off"):
            raise ValueError(f"enabled: false contradicts mode: {self.mode} (set mode alone)")
        if self.target_ratio >= self.trigger_ratio:
            raise ValueError("target_ratio must be below trigger_ratio (hysteresis)")
        if self.precompact_ratio and self.precompact_ratio >= self.trigger_ratio:
            raise ValueError("precompact_ratio must be below trigger_ratio (or null: off)")
        return self


class LoggingSettings(_Section):
    format: Literal["json", "text"] = "json"  # json: an object per line; text: key=value
    # The proxy's loggers; other libraries log warnings and up (uvicorn's: server.log_level).
    level: Literal["debug", "info", "warning", "error"] = "info"
    include_sensitive: bool = False  # request lines carry the raw session header (not keys)


class DefaultModelSpec(_Section):
    context_window: int = Field(32768, gt=0)
    max_output_tokens: int = Field(4096, gt=0)
    tokenizer: str | None = None  # None: from the name's family (models.default_tokenizer)
    precompact: bool = True  # false: no background summaries
    recall_tool: bool = True  # false: never the recall tool (compaction.recall_tool_rounds)
    # Requests its server answers at once (llama.cpp's -np); 1: background summaries give
    # way to turns (busy.py). None: as llama.cpp's /props says (discovery.py), else many.
    slots: int | None = Field(None, ge=1)


class ModelSpec(DefaultModelSpec):
    match: str = "*"
    context_window: int = Field(gt=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PROXY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    store: StoreSettings = StoreSettings()
    session: SessionSettings = SessionSettings()
    compaction: CompactionSettings = CompactionSettings()
    logging: LoggingSettings = LoggingSettings()
    models: list[ModelSpec] = []
    default_model: DefaultModelSpec = DefaultModelSpec()
    pricing: list[PriceRule] = []  # the ledger's money: none, tokens only
    tenants: list[TenantPolicy] = Field([], max_length=MAX_TENANTS)  # tenants.py
    _source: Path | None = PrivateAttr(None)  # the file read, which a reload reads again
    _tenants = model_validator(mode="after")(check_tenants)

    @property
    def requires_client_key(self) -> bool:
        """Whether a request without a caller credential is refused (see ServerSettings)."""
        if self.server.require_client_key is not None:
            return self.server.require_client_key
        return bool(self.upstream.api_key.get_secret_value())

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlSource(settings_cls))


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from an optional YAML file plus the environment; raises ConfigError with a
    message naming every bad key."""
    data = {} if path is None else read_config_file(path)
    with yaml_values(data):
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            raise ConfigError(describe_invalid(exc)) from exc
    settings._source = None if path is None else Path(path)
    return settings
