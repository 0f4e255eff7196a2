"""Per-tenant compaction policy: the ``tenants:`` entries of the YAML (README "Per-tenant
policy"), each resolved once, when the settings are loaded or reloaded, into the
effective ``CompactionSettings`` its tenants' requests use, so a request only looks its
tenant up (``PolicyTable.policy_for``: one dict read).

An entry names its tenants by ``id``, the tenant id ``GET /admin/tenants`` shows (the
first 12 hex digits of the keyed hash of the caller's key, or all 32), or by ``label``,
the operator's name for a group of such ids listed in ``ids``. No raw API key is ever
written here. A tenant no entry names gets ``compaction`` as configured. Fields left
out follow ``compaction``; ``precompact: false`` turns background pre-compaction off,
and a tenant's own ``trigger_ratio`` moves its pre-compaction threshold with it (the
same share of the trigger).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

if TYPE_CHECKING:
    from proxy.config import CompactionSettings, Settings

log = logging.getLogger("proxy.tenants")

MAX_TENANTS = 1000  # entries
MAX_IDS = 1000  # ids under one label
SHOWN = 12  # hex digits of a tenant id the admin API shows: what a lookup keys on
_ID = r"^([0-9a-f]{12,32}|anonymous)$"
# What an entry may change, besides the caps and precompact (a name of CompactionSettings).
_OVERRIDES = (
    "trigger_ratio",
    "target_ratio",
    "summarizer_model",
    "summary_max_tokens",
    "recall_tool_rounds",
)


def _switch(value: object) -> object:
    """YAML 1.1 (PyYAML) reads a bare ``off`` or ``on`` as a boolean: the mode it names."""
    return ("on" if value else "off") if isinstance(value, bool) else value


# A compaction mode, however YAML wrote it (``mode: off`` unquoted is false there).
Mode = Annotated[Literal["on", "shadow", "off"], BeforeValidator(_switch)]


class TenantPolicy(BaseModel):
    """One ``tenants:`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(None, pattern=_ID)
    label: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[\w.\-]+$")
    ids: list[Annotated[str, Field(pattern=_ID)]] = Field([], max_length=MAX_IDS)  # with label
    enabled: bool | None = None  # deprecated (__main__ warns): false is mode off
    mode: Mode | None = None
    trigger_ratio: float | None = Field(None, gt=0, le=1)
    target_ratio: float | None = Field(None, gt=0, le=1)
    summarizer_model: str | None = Field(None, min_length=1, max_length=256)
    summary_max_tokens: int | None = Field(None, gt=0, le=1_000_000)
    # Over a cap a turn due a summary is trimmed instead (X-Compaction-Degraded names it).
    summaries_per_hour: int | None = Field(None, ge=0)  # per clock hour (UTC)
    summarizer_tokens_per_day: int | None = Field(None, ge=0)  # input + output, per UTC day
    precompact: bool | None = None  # false: no background pre-compaction
    recall_tool_rounds: int | None = Field(None, ge=0, le=8)  # 0: no recall tool

    @model_validator(mode="after")
    def _names(self) -> TenantPolicy:
        if (self.id is None) == (self.label is None):
            raise ValueError("an entry names its tenants by id or by label (with ids), not both")
        if self.label is not None and not self.ids:
            raise ValueError(f"label {self.label!r} lists no ids")
        if self.id is not None and self.ids:
            raise ValueError("ids go with a label; an entry with id names one tenant")
        if self.enabled is False and self.mode not in (None, "off"):
            raise ValueError(f"enabled: false contradicts mode: {self.mode} (set mode alone)")
        return self

    @property
    def name(self) -> str:
        """What logs call the entry: its label, or its id."""
        return self.label or self.id or ""

    def effective(self, base: CompactionSettings) -> CompactionSettings:
        """``base`` with this entry's fields applied, validated as ``compaction`` is."""
        data = base.model_dump()
        for field in _OVERRIDES:
            if getattr(self, field) is not None:
                data[field] = getattr(self, field)
        mode = self.mode or ("off" if self.enabled is False else None)
        if self.enabled and mode is None:
            mode = "on" if base.effective_mode == "off" else base.effective_mode
        if mode is not None:
            data.update(mode=mode, enabled=True)
        early = base.precompact_ratio
        if early and self.trigger_ratio is not None:  # the same share of the trigger
            early = round(early * self.trigger_ratio / base.trigger_ratio, 6)
        if self.precompact is not None:
            fields = type(base).model_fields  # else the defaults' share of its trigger
            share = fields["precompact_ratio"].default / fields["trigger_ratio"].default
            early = (early or round(share * data["trigger_ratio"], 6)) if self.precompact else None
        data["precompact_ratio"] = early
        return type(base).model_validate(data)


@dataclass(frozen=True, slots=True)
class Policy:
    """One entry, resolved: what its tenants' requests compact with."""

    name: str
    compaction: CompactionSettings
    summaries_per_hour: int | None = None
    summarizer_tokens_per_day: int | None = None

    @property
    def capped(self) -> bool:
        return self.summaries_per_hour is not None or self.summarizer_tokens_per_day is not None


@dataclass(frozen=True, slots=True)
class PolicyTable:
    """Every entry resolved, by the shown part of each tenant id it names."""

    by_id: dict[str, tuple[str, Policy]]  # id[:SHOWN] -> (the id as written, its policy)
    entries: tuple[TenantPolicy, ...] = ()

    @classmethod
    def build(cls, entries: list[TenantPolicy], base: CompactionSettings) -> PolicyTable:
        """The table for ``entries`` over ``base``; ValueError naming the entry at fault."""
        by_id: dict[str, tuple[str, Policy]] = {}
        for i, entry in enumerate(entries):
            try:
                compaction = entry.effective(base)
            except ValidationError as exc:
                msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
                raise ValueError(f"tenants[{i}] ({entry.name}): {msg}") from None
            policy = Policy(
                entry.name,
                compaction,
                entry.summaries_per_hour,
                entry.summarizer_tokens_per_day,
            )
            for tenant in [entry.id] if entry.id else entry.ids:
                if tenant[:SHOWN] in by_id:
                    raise ValueError(f"tenants[{i}] ({entry.name}): id {tenant} is named twice")
                by_id[tenant[:SHOWN]] = (tenant, policy)
        return cls(by_id, tuple(entries))

    def policy_for(self, tenant: str) -> Policy | None:
        """The policy of the entry naming ``tenant`` (a full tenant id); None: the default."""
        found = self.by_id.get(tenant[:SHOWN])
        if found is None or not tenant.startswith(found[0]):
            return None
        return found[1]


def check_tenants(settings: Settings) -> Settings:
    """``Settings``' validator: every entry resolves over ``settings.compaction``."""
    PolicyTable.build(settings.tenants, settings.compaction)
    return settings


class TenantPolicies:
    """The table in force in this process, swapped whole by a reload (serve/reload.py).

    ``legacy_of`` gives a tenant's legacy id (``TenantIds.legacy_of``, core/tenant_ids.py)
    while a deployment whose ids moved to a key of its own still matches entries written
    with the old ones: such a match is used, and the log says once per tenant what its
    id is now (never the legacy id: that one anyone can compute from a key)."""

    def __init__(
        self, settings: Settings, legacy_of: Callable[[str], str | None] | None = None
    ) -> None:
        self.table = PolicyTable.build(settings.tenants, settings.compaction)
        self._legacy_of = legacy_of
        # Tenants warned of: each the one whose legacy id an entry names, so no more of
        # them than ids in the tables this process held.
        self._warned: set[str] = set()

    def policy_for(self, tenant: str, legacy: str | None = None) -> Policy | None:
        """``tenant``'s entry, or that of its ``legacy`` id (by default, ``legacy_of``'s:
        a request's caller passes the one it found from the request's credentials)."""
        if not self.table.by_id:
            return None
        found = self.table.policy_for(tenant)
        if found is not None or self._legacy_of is None:
            return found
        legacy = legacy or self._legacy_of(tenant)
        found = None if legacy is None else self.table.policy_for(legacy)
        if found is not None and tenant not in self._warned:
            self._deprecated(found, tenant)
        return found

    def _deprecated(self, policy: Policy, tenant: str) -> None:
        self._warned.add(tenant)
        # An entry named by id is named by the legacy id itself: not repeated here.
        entry = "named by id" if re.match(_ID, policy.name) else policy.name
        log.warning(
            "tenants entry (%s) names a tenant by its legacy id; its id is now %s: write "
            "that instead (legacy ids match until server.legacy_tenant_ids is false)",
            entry,
            tenant[:SHOWN],
        )
