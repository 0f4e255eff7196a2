"""tenant_ids.py: tenant ids keyed by the deployment, not by a constant in the source."""

from __future__ import annotations

from hashlib import blake2b

import pytest

from proxy.config import Settings
from proxy.core.tenant_ids import LEGACY_LIMIT, TenantIds, tenant_key, tenant_of

KEY = "sk-guessable-alice"
HEADERS = {"authorization": f"Bearer {KEY}"}
SECRET_A, SECRET_B = "a" * 32, "b" * 32


def _ids(**server: object) -> TenantIds:
    return TenantIds.from_settings(Settings(server=server))


def _from_source(credential: str) -> str:
    """The id a reader of the source computes for ``credential``: blake2b under the key
    written in it (what every id was before server.tenant_id_secret)."""
    joined = f"authorization:{credential}"
    return blake2b(joined.encode(), key=b"compaction-proxy/tenant/v1", digest_size=16).hexdigest()


def test_two_deployments_with_different_secrets_give_different_ids() -> None:
    one, two = _ids(tenant_id_secret=SECRET_A), _ids(tenant_id_secret=SECRET_B)
    assert one.of(HEADERS) != two.of(HEADERS)
    assert one.of(HEADERS) == _ids(tenant_id_secret=SECRET_A).of(HEADERS)  # replicas agree


def test_an_id_under_a_secret_is_not_the_one_the_source_computes() -> None:
    legacy = _from_source(f"Bearer {KEY}")
    assert TenantIds().of(HEADERS) == legacy  # without a secret or upstream key: as before
    assert _ids(tenant_id_secret=SECRET_A).of(HEADERS) != legacy
    assert _ids(tenant_id_secret=SECRET_A).of(HEADERS)[:12] != legacy[:12]


def test_without_a_secret_the_upstream_key_keys_the_ids() -> None:
    """A lent key's deployment: callers' keys are the operator's to choose (guessable)."""
    lent = TenantIds.from_settings(Settings(upstream={"api_key": "sk-upstream"}))
    assert lent.of(HEADERS) != _from_source(f"Bearer {KEY}")
    own = Settings(upstream={"api_key": "sk-upstream"}, server={"tenant_id_secret": SECRET_A})
    assert tenant_key(own)[1] == "secret"  # a secret of its own wins
    assert TenantIds.from_settings(own).of(HEADERS) == _ids(tenant_id_secret=SECRET_A).of(HEADERS)


def test_legacy_ids_are_known_only_while_migrating() -> None:
    migrating = _ids(tenant_id_secret=SECRET_A)
    tenant = migrating.of(HEADERS)
    assert migrating.legacy_of(tenant) == _from_source(f"Bearer {KEY}")
    assert migrating.legacy_of("0" * 32) is None  # a tenant not seen
    done = _ids(tenant_id_secret=SECRET_A, legacy_tenant_ids=False)
    assert done.legacy_of(done.of(HEADERS)) is None
    assert TenantIds().legacy_of(TenantIds().of(HEADERS)) is None  # nothing moved


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        Settings(server={"tenant_id_secret": "short"})
    assert tenant_key(Settings(server={"tenant_id_secret": ""}))[1] == "legacy"


def test_anonymous_stays_anonymous_under_a_secret() -> None:
    ids = _ids(tenant_id_secret=SECRET_A)
    assert ids.of({}) == "anonymous" == tenant_of(None)
    assert not ids.has_credential({"authorization": "Bearer "})


def test_a_flood_of_long_keys_does_not_forget_a_cached_tenants_legacy_id() -> None:
    """Credentials too long to cache add no legacy id: a client sending more distinct
    long keys than LEGACY_LIMIT cannot push out the legacy id of a tenant still cached,
    which a tenants: entry written before the move may name."""
    ids = _ids(tenant_id_secret=SECRET_A)
    tenant = ids.of(HEADERS)
    long_keys = ({"authorization": f"Bearer {i:08d}{'k' * 1100}"} for i in range(LEGACY_LIMIT))
    for headers in long_keys:
        ids.of(headers)
    assert ids.of(HEADERS) == tenant  # still cached: no miss to compute its legacy id again
    assert ids.legacy_of(tenant) == _from_source(f"Bearer {KEY}")
    long_one = {"authorization": f"Bearer {'k' * 1100}"}
    assert ids.legacy_of(ids.of(long_one), long_one) == _from_source(f"Bearer {'k' * 1100}")
    assert ids.legacy_of(ids.of(long_one)) is None  # not kept: computed from its headers
