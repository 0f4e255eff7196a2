"""``compaction:``, the settings of compacting: when (the trigger and the target), how
(the summarizer, its budget and deadline), ahead of time (pre-compaction), the back-offs,
the windows learned from overflows and recall. A ``tenants:`` entry refines them for its
tenants (tenant_entries.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator

from proxy.config.section import Section as _Section


def _switch(value: object) -> object:
    """YAML 1.1 (PyYAML) reads a bare ``off`` or ``on`` as a boolean: the mode it names."""
    return ("on" if value else "off") if isinstance(value, bool) else value


# A compaction mode, however YAML wrote it (``mode: off`` unquoted is false there).
Mode = Annotated[Literal["on", "shadow", "off"], BeforeValidator(_switch)]


class PrecompactSettings(_Section):
    """``compaction.precompact``: background pre-compaction (compaction/precompact.py)."""

    # Past this share of the window (below trigger_ratio) a session is compacted after the
    # answer, so the turn that crosses the trigger finds a snapshot ready; down to
    # target_ratio * ratio / trigger_ratio.
    ratio: float | None = Field(0.6, ge=0, lt=1)  # None or 0: off
    concurrency: int = Field(2, ge=1)  # background summaries at once, per process
    # ...of which one tenant keeps this many while another wants one (its newest run over it
    # is cancelled for a tenant under it). None: half of concurrency, rounded up.
    per_tenant: int | None = Field(None, ge=1)
    retry_s: float = Field(60.0, ge=0)  # after a background run failed or idle
    idle_s: float = Field(2.0, ge=0)  # one slot: no turn this long, then summarize


class BackoffSettings(_Section):
    """``compaction.backoff``: after a failed or cut-off summary, none for the session for
    first_s (its turns trimmed), doubling per failure in a row up to max_s, or 4x its time."""

    first_s: float = Field(30.0, ge=0)  # 0: off
    max_s: float = Field(900.0, ge=0)


class LearnedWindowSettings(_Section):
    """``compaction.learned_windows``: windows learned from overflows (upstream/windows.py)."""

    ttl_s: float = Field(24 * 3600, gt=0)
    # One caller's learned window is that caller's at once, everyone's once this many
    # tenants report it, lowered once per interval_s, by half at most.
    quorum: int = Field(2, ge=1)
    interval_s: float = Field(600.0, ge=0)


# Keys of this release's groups as the last one wrote them, flat: still read (and warned
# about at start-up, __main__) for one release.
RENAMED: dict[str, tuple[str, str]] = {
    "precompact_ratio": ("precompact", "ratio"),
    "precompact_concurrency": ("precompact", "concurrency"),
    "precompact_per_tenant": ("precompact", "per_tenant"),
    "precompact_retry_s": ("precompact", "retry_s"),
    "precompact_idle_s": ("precompact", "idle_s"),
    "summary_backoff_s": ("backoff", "first_s"),
    "summary_backoff_max_s": ("backoff", "max_s"),
    "learned_window_ttl_s": ("learned_windows", "ttl_s"),
    "learned_window_quorum": ("learned_windows", "quorum"),
    "learned_window_interval_s": ("learned_windows", "interval_s"),
}


def _regroup(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` with the flat keys of RENAMED moved into their groups, and those keys;
    ValueError when one is given both ways."""
    old = [key for key in data if key in RENAMED]
    if not old:
        return data, []
    data = dict(data)
    for key in old:
        group, name = RENAMED[key]
        section = data.get(group)
        section = (
            dict(section) if isinstance(section, dict) else section.model_dump() if section else {}
        )
        if name in section:
            raise ValueError(f"{key} is {group}.{name}: set it once, as {group}.{name}")
        section[name] = data.pop(key)
        data[group] = section
    return data, old


def _deprecated_keys(schema: dict[str, Any]) -> None:
    """The flat keys still read, in the JSON schema too (the chart validates its values
    with it: scripts/helm-schema), each marked deprecated with where it went."""
    for key, (group, name) in RENAMED.items():
        schema["properties"][key] = {"deprecated": True, "description": f"{group}.{name}"}


class CompactionSettings(_Section):
    model_config = ConfigDict(json_schema_extra=_deprecated_keys)

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
    pin_user_prefixes: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    min_tail_messages: int = Field(4, ge=1)
    elide_min_tokens: int = Field(400, ge=1)
    wait_for_summary_s: float = Field(30.0, ge=0)  # a session's requests wait for its summary
    precompact: PrecompactSettings = PrecompactSettings()
    cache_aware: bool = False  # hold a cached view until the trigger (compaction/held.py)
    force_interval_s: float = Field(30.0, ge=0)
    backoff: BackoffSettings = BackoffSettings()
    recover_overflow: bool = True  # the last line of defence: on even with enabled: false
    learned_windows: LearnedWindowSettings = LearnedWindowSettings()
    recall_budget_ratio: float = Field(0.1, ge=0, le=0.5)  # excerpts (recall.py); 0: off
    recall_tool_rounds: int = Field(0, ge=0, le=8)  # its calls answered a turn (recall_tool.py)

    @property
    def effective_mode(self) -> Literal["on", "shadow", "off"]:
        if self.mode is not None:
            return self.mode
        return "on" if self.enabled else "off"

    # The flat keys read (RENAMED), for start-up's deprecation warning.
    _renamed: tuple[str, ...] = PrivateAttr(())

    @model_validator(mode="wrap")
    @classmethod
    def _regrouped(cls, data: Any, handler: Any) -> CompactionSettings:
        old: list[str] = []
        if isinstance(data, dict):
            data, old = _regroup(data)
        settings: CompactionSettings = handler(data)
        if old:
            settings._renamed = tuple(old)
        return settings

    @model_validator(mode="after")
    def _check_ratios(self) -> CompactionSettings:
        if not self.enabled and self.mode not in (None, "off"):
            raise ValueError(f"enabled: false contradicts mode: {self.mode} (set mode alone)")
        if self.target_ratio >= self.trigger_ratio:
            raise ValueError("target_ratio must be below trigger_ratio (hysteresis)")
        if self.precompact.ratio and self.precompact.ratio >= self.trigger_ratio:
            raise ValueError("precompact.ratio must be below trigger_ratio (or null: off)")
        return self
