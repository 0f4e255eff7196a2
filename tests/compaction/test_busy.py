"""The proxy's own summaries by model (busy.py): which give way to a turn, and what is
still running after they did."""

from __future__ import annotations

import asyncio

from proxy.compaction.busy import BusyModels


async def _summary(busy: BusyModels, model: str, started: asyncio.Event, *, yields: bool) -> str:
    with busy.summarizing(model, yields=yields):
        started.set()
        await asyncio.sleep(30)
    return "finished"


def test_a_turn_cancels_only_the_summaries_that_give_way_on_its_model() -> None:
    async def scenario() -> None:
        busy = BusyModels()
        events = [asyncio.Event() for _ in range(3)]
        background = asyncio.create_task(_summary(busy, "m", events[0], yields=True))
        inline = asyncio.create_task(_summary(busy, "m", events[1], yields=False))
        other = asyncio.create_task(_summary(busy, "n", events[2], yields=True))
        await asyncio.gather(*(e.wait() for e in events))
        assert busy.give_way("m")  # the inline one still runs there
        await asyncio.gather(background, return_exceptions=True)
        assert background.cancelled()
        assert background in busy.gave_way
        assert not inline.done()
        assert not other.done()
        assert busy.running == {"m": 1, "n": 1}
        assert busy.give_way("m")  # asked again: the inline one is busy, and not cancelled
        await asyncio.sleep(0)
        assert not inline.done()
        inline.cancel()
        await asyncio.gather(inline, return_exceptions=True)
        assert inline not in busy.gave_way  # cancelled, but not to give way
        assert not busy.busy("m")
        assert "m" not in busy.yielding
        assert not busy.give_way("n")  # cancelled, and nothing else runs on n
        await asyncio.gather(other, return_exceptions=True)
        assert other.cancelled()
        assert busy.running == {}
        assert busy.yielding == {}

    asyncio.run(scenario())


def test_a_second_turn_before_the_cancelled_summary_has_left_finds_the_model_free() -> None:
    async def scenario() -> None:
        busy = BusyModels()
        started = asyncio.Event()
        background = asyncio.create_task(_summary(busy, "m", started, yields=True))
        await started.wait()
        assert not busy.give_way("m")  # cancelled: nothing else runs there
        assert not busy.give_way("m")  # still unwinding, already given way: not busy
        await asyncio.gather(background, return_exceptions=True)
        assert background.cancelled()
        assert busy.running == {}
        assert busy.yielding == {}

    asyncio.run(scenario())


def test_a_summary_whose_calls_ended_leaves_the_model_and_no_longer_gives_way() -> None:
    async def scenario() -> None:
        busy = BusyModels()
        with busy.summarizing("m", yields=True) as lease:
            assert busy.busy("m")
            lease.end()  # answered: saving its snapshot is no business of the model's
            assert not busy.busy("m")
            assert not busy.give_way("m")
            assert busy.gave_way == set()  # not cancelled: a finished summary is kept
            lease.end()  # once only
        assert busy.running == {}
        assert busy.yielding == {}

    asyncio.run(scenario())
