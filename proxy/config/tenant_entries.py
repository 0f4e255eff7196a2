"""``tenants:``, the per-tenant entries of the YAML (docs/configuration.md "Per-tenant
policy"): each names its tenants (by ``id``, or by a ``label`` over ``ids``) and the
fields of ``compaction`` it changes for them. ``resolve`` turns the entries into each
one's effective ``CompactionSettings`` and is what the settings validate them with;
the table a request looks its tenant up in is built from it (proxy/tenants.py).

Fields left out follow ``compaction``; ``precompact: false`` turns background
pre-compaction off, and a tenant's own ``trigger_ratio`` moves its pre-compaction
threshold with it (the same share of the trigger).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from proxy.config.compaction import CompactionSettings, Mode, PrecompactSettings

MAX_TENANTS = 1000  # entries
MAX_IDS = 1000  # ids under one label
SHOWN = 12  # hex digits of a tenant id the admin API shows: what a lookup keys on
ID_PATTERN = r"^([0-9a-f]{12,32}|anonymous)$"
# What an entry may change, besides the caps and precompact (a name of CompactionSettings).
_OVERRIDES = (
    "trigger_ratio",
    "target_ratio",
    "summarizer_model",
    "summary_max_tokens",
    "recall_tool_rounds",
)


class TenantPolicy(BaseModel):
    """One ``tenants:`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(None, pattern=ID_PATTERN)
    label: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[\w.\-]+$")
    ids: list[Annotated[str, Field(pattern=ID_PATTERN)]] = Field(
        [], max_length=MAX_IDS
    )  # with label
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
        early = base.precompact.ratio
        if early and self.trigger_ratio is not None:  # the same share of the trigger
            early = round(early * self.trigger_ratio / base.trigger_ratio, 6)
        if self.precompact is not None:
            # else the defaults' share of its trigger
            default = PrecompactSettings.model_fields["ratio"].default
            share = default / type(base).model_fields["trigger_ratio"].default
            early = (early or round(share * data["trigger_ratio"], 6)) if self.precompact else None
        data["precompact"]["ratio"] = early
        return type(base).model_validate(data)


def resolve(entries: list[TenantPolicy], base: CompactionSettings) -> list[CompactionSettings]:
    """Each entry's effective settings over ``base``, in order; ValueError naming the
    entry at fault (a field ``compaction`` would refuse, an id named twice)."""
    named: set[str] = set()
    resolved = []
    for i, entry in enumerate(entries):
        try:
            resolved.append(entry.effective(base))
        except ValidationError as exc:
            msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ValueError(f"tenants[{i}] ({entry.name}): {msg}") from None
        for tenant in [entry.id] if entry.id else entry.ids:
            if tenant[:SHOWN] in named:
                raise ValueError(f"tenants[{i}] ({entry.name}): id {tenant} is named twice")
            named.add(tenant[:SHOWN])
    return resolved
