"""What a failed store call met, as a closed set of labels (proxy/store/failures.py),
from the exceptions redis-py itself builds out of the server's error replies."""

from __future__ import annotations

import pytest
from redis import exceptions as rx
from redis._parsers.base import BaseParser

from proxy.errors import StoreError
from proxy.observe.metrics.series import STORE_FAILURE_KINDS
from proxy.store import failures
from proxy.store.failures import failure_kind
from proxy.store.health import ANSWERED, UNREACHABLE, Health


def reply(text: str) -> rx.RedisError:
    """The exception redis-py raises for the error reply ``-{text}``."""
    error = BaseParser.parse_error(text)
    assert isinstance(error, rx.RedisError)
    return error


def raised_from(exc: BaseException) -> StoreError:
    """A ``StoreError`` raised from ``exc``, as RedisStore raises them."""
    try:
        raise StoreError(f"redis save failed: {type(exc).__name__}") from exc
    except StoreError as error:
        return error


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (reply("MOVED 3999 127.0.0.1:6381"), "moved"),
        (reply("ASK 3999 127.0.0.1:6381"), "moved"),
        (reply("READONLY You can't write against a read only replica."), "readonly"),
        (reply("OOM command not allowed when used memory > 'maxmemory'."), "oom"),
        (reply("CROSSSLOT Keys in request don't hash to the same slot"), "crossslot"),
        (reply("NOPERM User proxy has no permissions to run the 'evalsha' command"), "noperm"),
        (reply("WRONGPASS invalid username-password pair or user is disabled."), "auth"),
        (reply("NOAUTH Authentication required."), "auth"),
        (reply("LOADING Redis is loading the dataset in memory"), "loading"),
        (reply("CLUSTERDOWN Hash slot not served"), "cluster_down"),
        (reply("TRYAGAIN Multiple keys request during rehashing of slot"), "cluster_down"),
        (reply("MASTERDOWN Link with MASTER is down"), "cluster_down"),
        # An older server wraps a script's error in a generic one; so may a client.
        (
            reply("ERR Error running script (call to f_1): @user_script:1: -READONLY You can't"),
            "readonly",
        ),
        (rx.ResponseError("MOVED 3999 127.0.0.1:6381"), "moved"),
        (rx.ResponseError("OOM command not allowed when used memory > 'maxmemory'."), "oom"),
        (reply("WRONGTYPE Operation against a key holding the wrong kind of value"), "other"),
        (reply("ERR unknown command 'FOO'"), "other"),
        (rx.TimeoutError("Timeout reading from socket"), "timeout"),
        (TimeoutError(), "timeout"),
        (
            rx.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
            "connection",
        ),
        (ConnectionRefusedError(111, "Connection refused"), "connection"),
        (rx.ConnectionError("No connection available."), "pool"),
        (rx.MaxConnectionsError("Too many connections"), "pool"),
        (rx.AuthenticationError("invalid username-password pair"), "auth"),
        (rx.RedisClusterException("Redis Cluster cannot be connected."), "other"),
        (rx.SlotNotCoveredError("Command # 1 (GET k) slot not covered"), "cluster_down"),
        (ValueError("not redis at all"), "other"),
    ],
)
def test_every_failure_is_named_by_a_kind_of_the_closed_set(error: Exception, kind: str) -> None:
    assert failure_kind(error) == kind
    assert failure_kind(raised_from(error)) == kind, "found through the StoreError's cause"
    assert kind in STORE_FAILURE_KINDS


def test_a_store_error_raised_from_nothing_is_other() -> None:
    assert failure_kind(StoreError("load: connection refused")) == "other"


def test_the_kinds_each_module_names_are_declared_series() -> None:
    named = set(failures._CODES.values()) | {kind for _, kind in failures._CLASSES}
    assert named | ANSWERED | UNREACHABLE <= set(STORE_FAILURE_KINDS)


@pytest.mark.parametrize(
    ("cause", "text"),
    [
        (None, "ok"),
        ("readonly", "degraded (readonly)"),
        ("oom", "degraded (oom)"),
        ("moved", "degraded (moved)"),
        ("connection", "unreachable (connection)"),
        ("auth", "unreachable (auth)"),
    ],
)
def test_health_reads_as_readyz_reports_it(cause: str | None, text: str) -> None:
    assert str(Health(cause)) == text
    assert Health(cause).ok is (cause is None)
