"""The settings' plain sections: server, upstream, store, session, logging, models.

Each a frozen pydantic model that refuses unknown keys (``_Section``); what a field means
is said beside it, and docs/configuration.md lists every key (a test checks it).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, SecretStr, model_validator

from proxy import config_file
from proxy.config.section import Section as _Section
from proxy.redact import redact_url


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
    forward_client_headers: list[str] = Field(default_factory=list)  # (Authorization never goes)

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
    encryption_keys: Annotated[list[SecretStr], AfterValidator(config_file.fernet_keys)] = Field(
        default_factory=list
    )
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
    body_fields: list[Literal["metadata.session_id", "user"]] = Field(default_factory=list)
    # Snapshots kept per derived session id (identical openings each keep their own) and
    # per named one (several conversations under one name; a rewind reuses an older one).
    derived_slots: int = Field(4, ge=1, le=32)
    explicit_slots: int = Field(4, ge=1, le=32)
    # A longer session name (header, prompt_cache_key, body field; UTF-8 bytes) gets a 400.
    max_name_bytes: int = Field(1024, ge=64)


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
