"""Settings: one YAML file, environment overrides, validated once at start-up.

Precedence, highest first: values passed to ``Settings(...)`` (tests), environment
variables (``PROXY_`` prefix, ``__`` between nested keys, e.g. ``PROXY_STORE__URL``), the
YAML file, then the defaults below. Strings in the YAML may reference the environment as
``${VAR}`` or ``${VAR:-default}`` so secrets stay out of the file (config_file.py reads
it). Unknown keys are errors that name the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from proxy.config.compaction import CompactionSettings as CompactionSettings
from proxy.config.compaction import Mode as Mode
from proxy.config.sections import DefaultModelSpec as DefaultModelSpec
from proxy.config.sections import LoggingSettings as LoggingSettings
from proxy.config.sections import ModelSpec as ModelSpec
from proxy.config.sections import ServerSettings as ServerSettings
from proxy.config.sections import SessionSettings as SessionSettings
from proxy.config.sections import StoreSettings as StoreSettings
from proxy.config.sections import UpstreamSettings as UpstreamSettings
from proxy.config.tenant_entries import MAX_TENANTS, TenantPolicy, resolve
from proxy.config_file import YamlSource, describe_invalid, read_config_file, yaml_values
from proxy.errors import ConfigError
from proxy.pricing import PriceRule


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
    tenants: list[TenantPolicy] = Field([], max_length=MAX_TENANTS)  # tenant_entries.py
    _source: Path | None = PrivateAttr(None)  # the file read, which a reload reads again

    @model_validator(mode="after")
    def _check_tenants(self) -> Settings:
        resolve(self.tenants, self.compaction)  # every entry resolves over compaction
        return self

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
