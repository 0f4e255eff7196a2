"""Tenant ids: which tenant a request belongs to, a keyed hash of its credentials.

The tenant is a keyed hash of the caller's credential, so the store never holds a key
and one tenant can never name another's session (DESIGN invariant 6). The key is the
deployment's (``tenant_key``): ``server.tenant_id_secret``, else one derived from
``upstream.api_key``; only without either is it the legacy key from the source, under
which anyone who guesses a credential can compute its id. A deployment whose ids moved
to a key of its own still knows each tenant's legacy id, for ``tenants:`` entries
written before the move (``TenantIds.legacy_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from hashlib import blake2b
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # read, never imported: no link in the import chain
    from proxy.config import Settings

# The key of the ids every release before server.tenant_id_secret computed, and still
# does without a secret: being in the source, it keys nothing (anyone can compute the id
# of a guessed credential). Kept to compute legacy ids, which tenants: entries may still
# name while a deployment migrates (TenantIds.legacy_of).
_TENANT_SALT = b"compaction-proxy/tenant/v1"
ANONYMOUS = "anonymous"


def tenant_of(authorization: str | None, key: bytes = _TENANT_SALT) -> str:
    """The tenant of a credential, keyed by ``key`` (a deployment's: ``tenant_key``; the
    default is the legacy one, which every reader of the source knows)."""
    # Without a credential every caller shares the "anonymous" tenant. That is only
    # reachable with server.require_client_key off (the default when the upstream needs
    # no key of the proxy's): a single-user setup, as the README's security section says.
    if not authorization:
        return ANONYMOUS
    return blake2b(authorization.encode(), key=key, digest_size=16).hexdigest()


TenantKeySource = Literal["secret", "upstream_key", "legacy"]


def tenant_key(settings: Settings) -> tuple[bytes, TenantKeySource]:
    """The key tenant ids are hashed under, and where it came from:
    ``server.tenant_id_secret``; else, derived from ``upstream.api_key`` (every replica of
    a deployment holds it, and it is the setup where callers' keys are the proxy's to
    choose, so guessable); else the legacy key (callers then bring their own provider
    keys: knowing one is having it, the id confirms nothing more)."""
    secret = settings.server.tenant_id_secret.get_secret_value()
    if secret:
        return _derived(b"secret", secret), "secret"
    upstream_key = settings.upstream.api_key.get_secret_value()
    if upstream_key:
        return _derived(b"upstream.api_key", upstream_key), "upstream_key"
    return _TENANT_SALT, "legacy"


def _derived(what: bytes, secret: str) -> bytes:
    # blake2b's key is at most 64 bytes, and a secret may be any length: hashed to 32,
    # in a domain of its own (the same string as an upstream key and as a secret differ).
    return blake2b(
        secret.encode(), key=b"compaction-proxy/tenant/v2/" + what, digest_size=32
    ).digest()


# Every header a provider accepts as the caller's key (OpenAI, Azure, Anthropic style).
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")
# What SDKs send for "no key": an empty bearer token is no credential.
_EMPTY = frozenset({"", "bearer"})


def _credentials(headers: Mapping[str, str]) -> list[str]:
    """The keys ``headers`` carry, each as the ``Authorization`` header that would carry
    it: one key is one tenant whichever header names it (an OpenAI SDK's Bearer token,
    Claude Code's ``x-api-key``, Azure's ``api-key``), so a session crosses APIs; a
    Bearer token hashes as it always did, so those tenants stay where they were."""
    found: list[str] = []
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if not value or value.strip().lower() in _EMPTY:
            continue
        entry = f"authorization:{value if name == 'authorization' else f'Bearer {value}'}"
        if entry not in found:
            found.append(entry)
    return found


TENANT_CACHE_SIZE = 1024
LEGACY_LIMIT = 10_000  # legacy ids kept, one per tenant seen lately
# A longer credential (real keys are under 200 bytes) is hashed every time: a client
# sending 64 KB "keys" must not make the cache hold 64 MB of them.
TENANT_CACHE_MAX_KEY = 1024
_Headers = tuple[str | None, str | None, str | None]


class TenantIds:
    """The tenants of requests under one deployment's ``key`` (``tenant_key``).

    The tenants of the credentials seen lately are kept by the credential headers' values:
    a client sends the same key on every request, and a lookup costs a fraction of the
    keyed hash. In process memory only (never stored, logged or exposed), at most
    TENANT_CACHE_SIZE entries, the oldest dropped first. Keyed by the values themselves,
    not a cheaper hash of them: a collision would put one caller in another's tenant.

    With ``legacy`` (a deployment whose ids moved to a key of its own), each tenant's
    legacy id is kept beside it, computed with it, at most ``LEGACY_LIMIT``: what
    ``tenants:`` entries written before the move still name (tenants.py). A credential
    too long to cache has its legacy id computed on each request instead."""

    def __init__(self, key: bytes = _TENANT_SALT, legacy: bool = False) -> None:
        self.key = key
        self.cache: dict[_Headers, str] = {}
        self._legacy: dict[str, str] | None = {} if legacy and key != _TENANT_SALT else None

    @classmethod
    def from_settings(cls, settings: Settings) -> TenantIds:
        key, _ = tenant_key(settings)
        return cls(key, settings.server.legacy_tenant_ids)

    def of(self, headers: Mapping[str, str]) -> str:
        """The tenant of a request: all the credentials it carries, hashed together."""
        key = (headers.get("authorization"), headers.get("api-key"), headers.get("x-api-key"))
        tenant = self.cache.get(key)
        if tenant is None:
            joined = "\n".join(_credentials(headers))
            tenant = tenant_of(joined or None, self.key)
            if len(joined) > TENANT_CACHE_MAX_KEY:
                return tenant  # nor its legacy id: legacy_of computes that from its headers
            if len(self.cache) >= TENANT_CACHE_SIZE:
                self.cache.pop(next(iter(self.cache)), None)
            self.cache[key] = tenant
            if self._legacy is not None and joined:
                # Added with the cache's entry, the newest last in both, and kept longer
                # (LEGACY_LIMIT > TENANT_CACHE_SIZE): a cached tenant's legacy id is
                # always known. An uncached credential adds none, so a flood of long
                # keys cannot push out the legacy id a tenants: entry still names.
                legacy = self._legacy.pop(tenant, None) or tenant_of(joined)
                if len(self._legacy) >= LEGACY_LIMIT:
                    self._legacy.pop(next(iter(self._legacy)), None)
                self._legacy[tenant] = legacy
        return tenant

    def has_credential(self, headers: Mapping[str, str]) -> bool:
        # The tenant without a credential is "anonymous", never a digest's hex: one lookup
        # in the tenants seen lately, which the request's tenant then finds again.
        return self.of(headers) != ANONYMOUS

    def legacy_of(self, tenant: str, headers: Mapping[str, str] | None = None) -> str | None:
        """``tenant``'s legacy id while legacy ids are still matched, else None: kept
        for the tenants seen lately; computed from ``headers`` (those of the request
        whose tenant ``tenant`` is) for any other, e.g. a credential too long to cache."""
        if self._legacy is None:
            return None
        legacy = self._legacy.get(tenant)
        if legacy is None and headers is not None and tenant != ANONYMOUS:
            legacy = tenant_of("\n".join(_credentials(headers)))
        return legacy


# Tenant ids under the legacy key: what a deployment without a secret of its own serves.
LEGACY_IDS = TenantIds()


def tenant_from_headers(headers: Mapping[str, str]) -> str:
    """The legacy tenant of a request (``LEGACY_IDS``); a deployment's are its
    ``Services.tenant_ids``'."""
    return LEGACY_IDS.of(headers)
