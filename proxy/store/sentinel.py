"""Redis behind Sentinel: the ``redis+sentinel://`` store URL and the client it makes.

```
redis+sentinel://[user:password@]host[:port][,host[:port]…]/<service>[/db][?options]
rediss+sentinel://…    TLS to the sentinels and to the data nodes alike
```

The grammar Prefect and docket use: the hosts are the sentinels (port 26379 unless
given), ``<service>`` the name they monitor (``sentinel monitor <service> …``), the
userinfo authenticates to the data nodes (their ``requirepass`` or ACL user), and the
``sentinel_username`` / ``sentinel_password`` options to the sentinels themselves
(their own ``requirepass``). The other options are redis-py's ``ssl_*`` ones, for both.
Passwords, in the userinfo or the query, are secrets: no message here repeats the URL.

The client asks the sentinels for the primary when it connects, and again at most every
``CHECK_S`` while it is used, so a failover is followed within that of the sentinels
naming the new primary (about 1 s after they promote it), even when the old primary stays
up and writable (``SENTINEL FAILOVER`` leaves it so until the sentinels reconfigure it,
8-20 s later); a connection to a node that is no longer the primary is closed when it is
next taken from the pool. A ``READONLY`` reply (the node
was demoted under an open connection) closes the connection and the command is sent
once more, to the primary the sentinels name now.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import redis.asyncio as aioredis
from redis.asyncio.connection import BlockingConnectionPool, Connection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ReadOnlyError, TimeoutError

log = logging.getLogger("proxy.store")

SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
DEFAULT_PORT = 26379
FORMAT = "redis+sentinel://[user:password@]host[:port][,host[:port]…]/<service>[/db]"
# How often a client in use asks the sentinels which node is the primary (one small
# round trip; what reaches a former primary meanwhile is lost).
CHECK_S = 0.5
_SENTINEL_AUTH = {"sentinel_username": "username", "sentinel_password": "password"}


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith(SCHEMES)


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """A ``redis+sentinel://`` URL taken apart."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    tls: bool
    # Connection options for the data nodes (auth, db, ssl_*) and for the sentinels.
    node: dict[str, Any] = field(default_factory=dict, repr=False)
    sentinel: dict[str, Any] = field(default_factory=dict, repr=False)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """``url`` taken apart; ValueError (not naming any secret) when it is not one."""
    scheme, _, rest = url.partition("://")
    tls = scheme.lower() == "rediss+sentinel"
    if not is_sentinel_url(url):
        raise ValueError(f"not a Sentinel URL: {FORMAT}")
    netloc, path, query = _split(rest)
    userinfo, _, hosts = netloc.rpartition("@")
    service, db = _service(path)
    sentinel, options = _options(query)
    # The data nodes' options, parsed as redis-py parses a redis:// URL's.
    node = dict(
        parse_url(f"redis://{userinfo}{'@' if userinfo else ''}_/{db}?{urlencode(options)}")
    )
    node.pop("host", None)
    sentinel.update({k: v for k, v in node.items() if k.startswith("ssl_")})
    if tls:
        sentinel["ssl"] = True
    return SentinelUrl(_hosts(hosts), service, tls, node, sentinel)


def _service(path: str) -> tuple[str, str]:
    """The service a Sentinel URL's path names, and its database (``0`` unless given)."""
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"store.url: a Sentinel URL names its service: {FORMAT}")
    return parts[0], parts[1] if len(parts) == 2 else "0"


def _options(query: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The Sentinel nodes' own options of ``query`` (their credentials, by redis-py's
    names), then the rest: the data nodes' ``ssl_*``; ValueError for any other."""
    options = dict(parse_qsl(query, keep_blank_values=True))
    sentinel: dict[str, Any] = {
        _SENTINEL_AUTH[k]: options.pop(k) for k in list(options) if k in _SENTINEL_AUTH
    }
    unknown = sorted(k for k in options if not k.startswith("ssl_"))
    if unknown:
        raise ValueError(f"store.url: unknown Sentinel URL option(s) {', '.join(unknown)}")
    return sentinel, options


def _split(rest: str) -> tuple[str, str, str]:
    """The netloc, path and query of what follows ``scheme://``."""
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    return netloc, slash + path, query


def _hosts(hosts: str) -> tuple[tuple[str, int], ...]:
    found = []
    for item in hosts.split(","):
        host, port = item.strip(), DEFAULT_PORT
        if host.rsplit(":", 1)[-1].isdigit() and not host.endswith("]"):
            host, _, number = host.rpartition(":")
            port = int(number)
        host = host.removeprefix("[").removesuffix("]")
        if not host:
            raise ValueError(f"store.url: a Sentinel URL lists host:port pairs: {FORMAT}")
        found.append((host, port))
    return tuple(found)


def sentinel_client(url: str, pool: Mapping[str, Any]) -> aioredis.Redis:
    """A client of the primary the sentinels of ``url`` name, following failovers.
    ``pool``: the options of the standalone store's pool (size, wait, timeouts, and the
    retry of a failed connection, which covers a demoted primary's READONLY too)."""
    target = parse_sentinel_url(url)
    timeouts = {k: v for k, v in pool.items() if k.startswith("socket_")}
    # Each sentinel asked once: redis-py's default retries with backoff made a call wait
    # 20 s and more when none answered (or all refused the password).
    once = {"retry": Retry(NoBackoff(), 0), **timeouts, **target.sentinel}
    manager = Sentinel(target.sentinels, sentinel_kwargs=once)  # type: ignore[no-untyped-call]
    connection = _SSLConnection if target.tls else _Connection
    client: aioredis.Redis = manager.master_for(
        target.service,
        redis_class=_Client,
        connection_pool_class=_Pool,
        connection_class=connection,
        **{**pool, **target.node},
    )
    return client


class _Demoted(ConnectionError):
    """The node taken for the primary answered READONLY: it is a replica now."""


class _Connection(SentinelManagedConnection):
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await Connection.read_response(self, *args, **kwargs)
        except ReadOnlyError as exc:
            # The command is sent once more (it was refused, not run), to the primary the
            # sentinels name now: a retry reconnects to ``host``/``port`` as they stand.
            await self.disconnect()
            self.host, self.port = await self.connection_pool.get_master_address()
            raise _Demoted("the primary was demoted") from exc


class _SSLConnection(_Connection, SSLConnection):
    pass


class _Pool(SentinelConnectionPool, BlockingConnectionPool):
    """The standalone store's blocking pool, asking the sentinels for the primary at most
    once every ``CHECK_S`` as connections are taken, closing one to a former primary."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._next_check = 0.0

    async def get_master_address(self) -> Any:
        before = self.master_address
        address = await super().get_master_address()  # type: ignore[no-untyped-call]
        if before is not None and address != before:
            new, old = ":".join(map(str, address)), ":".join(map(str, before))
            log.warning("store: the sentinels name a new primary, %s (was %s)", new, old)
        return address

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CHECK_S
            # Closes the idle connections when the primary moved. Sentinels unreachable:
            # the open connections go on, and a new one fails.
            with contextlib.suppress(ConnectionError, TimeoutError):
                await self.get_master_address()
        conn = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        where = (conn.host, conn.port)
        if conn.is_connected and self.master_address and where != self.master_address:
            await conn.disconnect()  # it was busy when the primary moved: the next command
            conn.host, conn.port = self.master_address  # reconnects, there
        return conn


class _Client(aioredis.Redis):
    """Closes the sentinels' connections with its own."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if isinstance(self.connection_pool, _Pool):
            await self.connection_pool.sentinel_manager.aclose()
