"""What ``check-config`` asks of a Redis store: ``inspect_store``.

The store is reached as serving reaches it (``RedisStore``: the URL's topology, its
credentials and TLS) and PINGed; a URL naming one node of a Redis Cluster is refused
as start-up refuses it; the learned windows are read; and on request a lock is taken
and released (a write, a delete and a script, as serving does). What fails is said in
words (``StoreReport.problem``): whether the store could not be reached, refused the
credentials, or answered but refused the rest, never with an exception's own text (a
client may quote its options, a password among them).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from proxy.config import StoreSettings
from proxy.core.session import SessionKey
from proxy.errors import StoreError
from proxy.store.connect import refuse_cluster_node
from proxy.store.failures import ERRORS, failure_kind
from proxy.store.redis import RedisOptions, RedisStore

# The check waits at least this long for the store (store.timeout_s if longer): a first
# connect (TLS, AUTH) from a cold process may take longer than serving's calls do.
CHECK_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class StoreReport:
    """What the check found: ``problem`` None when the store is usable, else the words
    that follow its URL ("refuses the credentials (…)"); the learned windows, or why
    they could not be read."""

    problem: str | None
    windows: dict[str, int] | None = None
    windows_problem: str | None = None


async def inspect_store(settings: StoreSettings, write: bool) -> StoreReport:
    """Reach, PING and read the store ``settings`` names; with ``write``, write to it.
    ``ConfigError`` for a URL naming one node of a cluster."""
    timeout_s = max(settings.timeout_s, CHECK_TIMEOUT_S)
    options = RedisOptions(prefix=settings.prefix, timeout_s=timeout_s, max_connections=4)
    store = RedisStore(settings.url, settings.ttl_s, options)
    try:
        try:
            await store.client.ping()
        except ERRORS as exc:
            # NOPERM comes after AUTH passed: an ACL user serving needs no PING for.
            if _specific(exc)[0] != "noperm":
                return StoreReport(unusable(exc, timeout_s))
        await refuse_cluster_node(settings.url)
        try:
            windows: dict[str, int] | None = await store.learned_windows()
            unread = None
        except StoreError as exc:
            windows, unread = None, exc.message
        if write:
            key = SessionKey("check-config", secrets.token_hex(8), "header")
            try:
                token = await store.acquire(key, ttl_s=10)
                if token is None:
                    return StoreReport(
                        "refuses writes (a test write did not take)", windows, unread
                    )
                await store.release(key, token)
            except StoreError as exc:
                return StoreReport(f"refuses writes ({_cause(exc)})", windows, unread)
        return StoreReport(None, windows, unread)
    finally:
        await store.aclose()


def unusable(exc: BaseException, timeout_s: float) -> str:
    """Why a store whose PING raised ``exc`` cannot be used, in words."""
    kind, origin = _specific(exc)
    if kind == "auth":
        return "refuses the credentials (NOAUTH/WRONGPASS: the user or password in store.url)"
    if "AuthenticationError" in str(origin):
        # MasterNotFoundError: what each sentinel answered is only in its text.
        return "refuses the credentials (the sentinels': sentinel_password in store.url)"
    if kind == "timeout":
        return f"is unreachable (no answer within {timeout_s:g} s)"
    if kind == "connection":
        return f"is unreachable (connection: {type(origin).__name__})"
    if "cluster support disabled" in str(origin):
        return "is one server, not a Redis Cluster (use redis://host:port/db)"
    return f"answers, but cannot be used ({kind}: {type(origin).__name__})"


def _specific(exc: BaseException) -> tuple[str, BaseException]:
    """The most specific failure in ``exc``'s chain (a cluster client wraps what its nodes
    said), and the exception that is it."""
    chain = [exc]
    while (link := chain[-1].__cause__ or chain[-1].__context__) and link not in chain:
        chain.append(link)
    kinds = [(failure_kind(link), link) for link in chain]
    return next(((k, e) for k, e in kinds if k != "other"), ("other", chain[-1]))


def _cause(exc: BaseException) -> str:
    """``exc``'s failure kind and the class of what it was raised from."""
    origin = exc.__cause__ or exc
    return f"{failure_kind(exc)}: {type(origin).__name__}"
