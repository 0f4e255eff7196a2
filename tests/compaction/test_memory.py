"""memory.py: one replica's memory of its sessions is one bounded table, whatever part of
the proxy writes to it: a flood of session ids cannot grow it past its bound, however the
writes spread over the rate limits, back-offs, sightings and cuts."""

from __future__ import annotations

from proxy.compaction.backoff import SummaryBackoff
from proxy.compaction.memory import RECORD_WEIGHT, SessionMemory
from proxy.compaction.schedule import Schedule
from proxy.core.session import session_from_header
from proxy.core.trim import Cut
from proxy.core.view import View
from tests.support.fakes import (
    FakeClock,
    FakeUpstream,
    fake_settings,
    make_services,
)


def test_facts_of_one_session_from_different_owners_share_one_record() -> None:
    memory, clock = SessionMemory(limit=4), FakeClock()
    schedule = Schedule(30, memory, clock=clock)
    failed = SummaryBackoff(30, 900, clock, memory, "failed")
    idle = SummaryBackoff(30, 900, clock, memory, "idle")
    k = session_from_header("tenant", "one")
    assert schedule.may_force(k)
    failed.failed(k)
    idle.failed(k)
    assert len(memory) == 1
    assert not schedule.may_force(k)  # the rate limit survived the other writes
    assert failed.active(k)
    assert idle.active(k)
    failed.succeeded(k)  # one streak ends, the other does not
    assert not failed.active(k)
    assert idle.active(k)


def test_writes_spread_over_owners_stay_within_one_bound() -> None:
    memory, clock = SessionMemory(limit=8), FakeClock()
    schedule = Schedule(30, memory, clock=clock)
    backoff = SummaryBackoff(30, 900, clock, memory)
    for n in range(100):  # a client choosing fresh session ids for every kind of write
        schedule.may_force(session_from_header("tenant", f"f{n}"))
        backoff.failed(session_from_header("tenant", f"b{n}"))
    assert len(memory) == 8
    newest = session_from_header("tenant", "b99")
    oldest = session_from_header("tenant", "f0")
    assert backoff.active(newest)
    assert memory.get(oldest) is None  # the least recently used went first


def test_records_that_carry_text_weigh_it() -> None:
    memory = SessionMemory(limit=10)
    cut = Cut(1, 0, View(1, 0, 1), "prefix", "x" * (3 * RECORD_WEIGHT))  # 4 records' weight
    for n in range(4):
        k = session_from_header("tenant", f"s{n}")
        record = memory.of(k)
        record.cut = cut
        memory.weighed(k, record)
    assert len(memory) == 2  # 2 x 4 weigh 8 of 10; a third would not fit


def test_the_app_keeps_one_memory_for_every_owner() -> None:
    clock = FakeClock()
    services = make_services(fake_settings(), FakeUpstream(), clock)
    k = session_from_header("tenant", "shared")
    services.schedule.may_force(k)
    services.compactor.backoff.failed(k)
    services.compactor.idle.failed(k)
    assert len(services.compactor.memory) == 1
