"""Per-tenant compaction policy in force: the ``tenants:`` entries (config/tenant_entries.py)
each resolved once, when the settings are loaded or reloaded, into the effective
``CompactionSettings`` its tenants' requests use, so a request only looks its tenant up
(``PolicyTable.policy_for``: one dict read).

An entry names its tenants by ``id``, the tenant id ``GET /admin/tenants`` shows (the
first 12 hex digits of the keyed hash of the caller's key, or all 32), or by ``label``,
the operator's name for a group of such ids listed in ``ids``. No raw API key is ever
written here. A tenant no entry names gets ``compaction`` as configured.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from proxy.config import CompactionSettings, Settings
from proxy.config.tenant_entries import ID_PATTERN, SHOWN, TenantPolicy, resolve

log = logging.getLogger("proxy.tenants")
__all__ = ["SHOWN", "Policy", "PolicyTable", "TenantPolicies"]  # SHOWN: where callers look


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
        for entry, compaction in zip(entries, resolve(entries, base), strict=True):
            caps = (entry.summaries_per_hour, entry.summarizer_tokens_per_day)
            policy = Policy(entry.name, compaction, *caps)
            for tenant in [entry.id] if entry.id else entry.ids:
                by_id[tenant[:SHOWN]] = (tenant, policy)
        return cls(by_id, tuple(entries))

    def policy_for(self, tenant: str) -> Policy | None:
        """The policy of the entry naming ``tenant`` (a full tenant id); None: the default."""
        found = self.by_id.get(tenant[:SHOWN])
        if found is None or not tenant.startswith(found[0]):
            return None
        return found[1]


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
        entry = "named by id" if re.match(ID_PATTERN, policy.name) else policy.name
        log.warning(
            "tenants entry (%s) names a tenant by its legacy id; its id is now %s: write "
            "that instead (legacy ids match until server.legacy_tenant_ids is false)",
            entry,
            tenant[:SHOWN],
        )
