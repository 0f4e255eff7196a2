"""Fairness and cost (issue 20, items 10-12), in-process: the background slot decisions
between tenants, and the chunks a compaction's call budget leaves out.

End to end (the real proxy, the simulator, clients over HTTP): tests/e2e/test_fairness_e2e.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from proxy.compaction.chunking import _newest_within
from proxy.compaction.job import Job
from proxy.core.session import session_from_header
from proxy.core.transcript import Entry, chunk_transcript
from proxy.core.wording import omitted_marker
from tests.support.precompaction import (
    _conversation,
    _job,
    _outcomes,
    _services,
)

# Item 10: background summary slots are shared fairly between tenants.


class _Gated:
    """A store whose snapshot reads wait for ``gate``: background runs that stay running."""

    def __init__(self, store: Any, gate: asyncio.Event) -> None:
        self._store, self._gate = store, gate

    async def load(self, key: Any) -> Any:
        await self._gate.wait()
        return await self._store.load(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_tenant_under_its_share_preempts_only_a_tenant_over_its_own() -> None:
    """In-process: the slot decisions (3 slots, so a share of 2 each)."""
    services = await _services(precompact_concurrency=3)
    try:
        pre = services.precompactor
        assert pre.share == 2
        gate = asyncio.Event()  # every run blocks on its first store read until opened
        services.compactor.store = _Gated(services.compactor.store, gate)

        async def job(tenant: str, session: str) -> Job:
            made = await _job(services, session, _conversation(2))
            return replace(made, key=session_from_header(tenant, session))

        a = [await job("a", f"a{i}") for i in range(3)]
        for each in a:
            await pre.start(each)  # nobody else wants one: a fills every slot
        assert set(pre.running) == {k.key for k in a}
        await pre.start(await job("b", "b0"))  # a is over its share: its newest goes
        assert set(pre.running) == {a[0].key, a[1].key, session_from_header("b", "b0")}
        await pre.start(await job("c", "c0"))  # nobody over their share: skipped
        await pre.start(await job("a", "a9"))  # a at its share: skipped
        assert _outcomes(services) == {"preempted": 1, "skipped_cap": 2}
        assert not pre.backed_off(a[2].key)  # a preempted session is not backed off
        gate.set()
        await asyncio.gather(*pre.running.values())
        assert _outcomes(services) == {"preempted": 1, "skipped_cap": 2, "covered": 3}
    finally:
        await services.aclose()


# Item 12: the summary work a client can buy.


def test_chunks_beyond_the_call_budget_leave_the_oldest_messages_out_marked() -> None:
    entries = [Entry("user", f"message {i} " + "x" * 50) for i in range(10)]
    entries[7] = Entry("user", "long " + "y" * 200)  # continues over several chunks
    chunks = chunk_transcript(entries, 120)
    assert len(chunks) > 4
    kept, omitted = _newest_within(chunks, 4)
    assert len(kept) == 3  # a call to spare for a retry
    assert kept[0][0] == Entry("system", omitted_marker(omitted))
    assert kept[1:] == chunks[-2:]
    assert kept[0][1:] == chunks[-3]
    whole = [entry for chunk in chunks[:-3] for entry in chunk]
    starts = sum(entry.part == 1 for entry in whole)
    assert omitted == starts - (chunks[-3][0].part > 1)
    assert _newest_within(chunks[:4], 4) == (chunks[:4], 0)  # within the budget: all
