"""Plain numbers behind the series every request moves (recorder.py, ledger.py).

prometheus-client keeps each child's number in a ``MutexValue``: a lock taken on every
``inc`` (~0.23 µs against ~0.05 for a plain add, ~15 a request). The series a finished
request moves are only ever moved on the event loop's thread, and read by ``/metrics``
on that same thread, so ``plain(child)`` puts a ``Tally`` (a bare float) in the value's
place: the family, its samples and their exposition are prometheus-client's own, as
are the values' ``inc`` / ``set`` / ``get`` interface. In multiprocess mode
(``server.workers``) a value lives in a shared file; it is left as it is.
"""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client.values import MutexValue


class Value(Protocol):
    def inc(self, amount: float) -> None: ...

    def get(self) -> float: ...


class Tally:
    """A child's number, unlocked: moved on one thread only (see the module's doc)."""

    __slots__ = ("value",)

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def inc(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value = value

    def get(self) -> float:
        return self.value

    def set_exemplar(self, exemplar: Any) -> None:
        raise TypeError("a Tally keeps no exemplar")  # none of ours takes one

    def get_exemplar(self) -> None:
        return None


def plain(value: Any) -> Value:
    """``value`` (a child's ``MutexValue``) as a ``Tally`` holding its number; any
    other value (multiprocess mode's) as it is. Put it back where ``value`` was."""
    if type(value) is MutexValue:
        return Tally(value.get())  # type: ignore[no-untyped-call]  # untyped upstream
    return value  # type: ignore[no-any-return]


def plain_child(child: Any, attribute: str = "_value") -> Value:
    """The value of ``child`` (a Counter's or a Gauge's: ``_value``; a Histogram's:
    ``_sum``), made plain in place."""
    value = plain(getattr(child, attribute))
    setattr(child, attribute, value)
    return value


def plain_buckets(child: Any) -> list[Value]:
    """A Histogram child's bucket values, made plain in place (ascending bounds)."""
    buckets: list[Value] = [plain(bucket) for bucket in child._buckets]
    child._buckets = buckets
    return buckets
