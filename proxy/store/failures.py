"""What a failed store call met, as one label of a closed set (``STORE_FAILURE_KINDS``).

The store raises ``StoreError`` from the client's exception; this names the first
exception in that chain it recognises. redis-py maps most error replies to a class of
their own (``MovedError``, ``ReadOnlyError``, ``OutOfMemoryError``...), but an older
server wraps a script's error in a generic ``ResponseError`` ("ERR Error running
script ... -READONLY ..."), and a client may not map every reply: those are read by
the reply's code. Anything unrecognised is ``other``, never the message itself.
"""

from __future__ import annotations

import re

from redis import exceptions as rx

# What a call to any of the store's clients raises: a cluster that cannot be reached or
# mapped raises RedisClusterException, which is not a RedisError. Here, below every
# module that catches it (connect.py imports cluster.py, which needs it too).
ERRORS = (rx.RedisError, rx.RedisClusterException)
# Every kind is one of observe.metrics.series.STORE_FAILURE_KINDS (tests/store/test_failures.py).
# Most specific first: MovedError is an AskError, BusyLoadingError a ConnectionError...
_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (rx.AskError, "moved"),  # MOVED, and ASK (a slot being migrated)
    (rx.ClusterCrossSlotError, "crossslot"),
    (rx.CrossSlotTransactionError, "crossslot"),
    (rx.ClusterDownError, "cluster_down"),  # CLUSTERDOWN, MASTERDOWN
    (rx.TryAgainError, "cluster_down"),
    (rx.SlotNotCoveredError, "cluster_down"),
    (rx.ReadOnlyError, "readonly"),
    (rx.OutOfMemoryError, "oom"),
    (rx.NoPermissionError, "noperm"),
    (rx.AuthenticationError, "auth"),
    (rx.AuthenticationWrongNumberOfArgsError, "auth"),
    (rx.AuthorizationError, "auth"),
    (rx.BusyLoadingError, "loading"),
    (rx.TimeoutError, "timeout"),
    (TimeoutError, "timeout"),  # asyncio's, since 3.11
    (rx.MaxConnectionsError, "pool"),
    (rx.ConnectionError, "connection"),
    (ConnectionError, "connection"),
    (OSError, "connection"),
)
# Error replies by their code, wherever a generic ResponseError carries one.
_CODES = {
    "MOVED": "moved",
    "ASK": "moved",
    "CROSSSLOT": "crossslot",
    "CLUSTERDOWN": "cluster_down",
    "MASTERDOWN": "cluster_down",
    "TRYAGAIN": "cluster_down",
    "READONLY": "readonly",
    "OOM": "oom",
    "NOPERM": "noperm",
    "NOAUTH": "auth",
    "WRONGPASS": "auth",
    "LOADING": "loading",
}
_CODE = re.compile(r"(?:^|-)(" + "|".join(_CODES) + r")\b")
_POOL_EMPTY = "No connection available"  # BlockingConnectionPool: none free in time


def failure_kind(exc: BaseException) -> str:
    """The kind of failure ``exc`` (or what it was raised from) is; ``other`` if unknown."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        kind = _kind_of(cause)
        if kind is not None:
            return kind
        cause = cause.__cause__ or cause.__context__
    return "other"


def _kind_of(exc: BaseException) -> str | None:
    if isinstance(exc, rx.ResponseError) and not isinstance(exc, rx.AskError):
        match = _CODE.search(str(exc))
        if match:
            return _CODES[match.group(1)]
    if isinstance(exc, rx.ConnectionError) and str(exc).startswith(_POOL_EMPTY):
        return "pool"
    for cls, kind in _CLASSES:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, rx.RedisError | rx.RedisClusterException):
        return "other"
    return None
