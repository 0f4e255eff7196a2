"""The test harness's start of Redis servers (tests/support/redis_start.py): fresh ports
after a taken one, a bounded number of times; other failures at once. The servers
themselves: tests/e2e/test_redis_start_e2e.py."""

from __future__ import annotations

import pytest

from tests.support.redis_start import ATTEMPTS, StartFailed, free_ports, with_fresh_ports

TAKEN = "# Could not create server TCP listening socket 127.0.0.1:7: bind: Address already in use"


def test_free_ports_are_distinct() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert all(1024 <= port <= 65535 for port in ports)


def test_a_failure_names_a_taken_port_only_when_the_log_says_so() -> None:
    assert StartFailed("redis-server", 1, TAKEN).port_in_use
    failed = StartFailed("redis-server", 1, "FATAL CONFIG FILE ERROR")
    assert not failed.port_in_use
    assert "exit 1" in str(failed)
    assert "FATAL CONFIG FILE ERROR" in str(failed)


class Starts:
    """An ``attempt`` failing on a taken port its first ``taken`` times."""

    def __init__(self, taken: int, then: BaseException | None = None) -> None:
        self.taken, self.then = taken, then
        self.attempts: list[int] = []
        self.stops = 0

    def attempt(self, n: int) -> None:
        self.attempts.append(n)
        if len(self.attempts) <= self.taken:
            raise StartFailed("redis-server", 1, TAKEN)
        if self.then is not None:
            raise self.then

    def stop(self) -> None:
        self.stops += 1


def test_a_taken_port_is_tried_again_with_fresh_ports() -> None:
    starts = Starts(taken=ATTEMPTS - 1)
    with_fresh_ports(starts.attempt, starts.stop)
    assert starts.attempts == list(range(ATTEMPTS))
    assert starts.stops == ATTEMPTS - 1


def test_tries_are_bounded() -> None:
    starts = Starts(taken=ATTEMPTS + 5)
    with pytest.raises(StartFailed, match="Address already in use"):
        with_fresh_ports(starts.attempt, starts.stop)
    assert starts.attempts == list(range(ATTEMPTS))
    assert starts.stops == ATTEMPTS


@pytest.mark.parametrize(
    "failure", [StartFailed("redis-server", 1, "FATAL"), RuntimeError("did not answer")]
)
def test_any_other_failure_is_not_tried_again(failure: BaseException) -> None:
    starts = Starts(taken=1, then=failure)
    with pytest.raises(type(failure)):
        with_fresh_ports(starts.attempt, starts.stop)
    assert starts.attempts == [0, 1]
    assert starts.stops == 2
