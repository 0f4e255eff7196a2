"""The YAML file behind the settings: read, ``${VAR}`` filled in from the
environment, and handed to pydantic-settings as a source; validation errors
named by their dotted key. The simulator's config file is read the same way.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from proxy.errors import ConfigError

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

# The YAML contents for the Settings currently being built; a ContextVar so
# building settings from two files concurrently (tests) cannot mix them up.
_yaml_data: ContextVar[dict[str, Any] | None] = ContextVar("_yaml_data", default=None)


class YamlSource(PydanticBaseSettingsSource):
    """What ``yaml_values`` set, below the environment in precedence."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ is overridden; pydantic-settings never calls this

    def __call__(self) -> dict[str, Any]:
        return dict(_yaml_data.get() or {})


@contextmanager
def yaml_values(data: dict[str, Any]) -> Iterator[None]:
    """Settings built inside this block read ``data`` as their YAML file."""
    token = _yaml_data.set(data)
    try:
        yield
    finally:
        _yaml_data.reset(token)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The config file's mapping with ``${VAR}`` and ``${VAR:-default}`` filled in."""
    value: dict[str, Any] = _interpolate(read_yaml_mapping(path, "config file"), "")
    return value


def _interpolate(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{where}: environment variable {name} is not set")

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def read_yaml_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file ({} when empty); ConfigError otherwise."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {exc}") from exc
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{what} {path} must contain a mapping at the top level")
    return raw or {}


def describe_invalid(exc: ValidationError) -> str:
    """Every validation problem on its own line, named by its dotted key."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {key}: {msg}")
    return "invalid configuration:\n" + "\n".join(lines)


def fernet_keys(keys: list[SecretStr]) -> list[SecretStr]:
    """``store.encryption_keys`` as set: the empty ones dropped (``${OLD_KEY:-}`` for an
    optional rotation key interpolates to ""), each of the rest a Fernet key."""
    keys = [k for k in keys if k.get_secret_value()]
    for i, key in enumerate(keys):
        try:
            raw = base64.urlsafe_b64decode(key.get_secret_value().encode())
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"encryption_keys[{i}] is not a Fernet key (32 base64url bytes)")
    return keys


def _tenant_secret(secret: SecretStr) -> SecretStr:
    if 0 < len(secret.get_secret_value().encode()) < 16:  # guessable in its turn
        raise ValueError("shorter than 16 bytes (openssl rand -hex 32 makes one)")
    return secret


# server.tenant_id_secret, the key tenant ids are hashed under (core/tenant_ids.py): the
# same on every replica, kept across restarts (a new one moves every tenant); empty, or
# at least 16 bytes.
TenantSecret = Annotated[SecretStr, AfterValidator(_tenant_secret)]
