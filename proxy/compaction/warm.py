"""After a background compaction on a single-slot server: its view read into the slot's
prompt cache while no turn waits, so the next turn does not read it cold.

A server with one slot (llama.cpp's ``-np 1``) keeps the prompt it read last and reuses
only the longest prefix the next one shares with it, never skipping text a prompt adds
(bench/README.md "Real model"). A new snapshot's handoff comes right after the system
prompt, and the summary call itself took the slot, so the first turn served the new
snapshot read its whole view again: tens of seconds on a CPU, the turns that set the
real-model p95. So once a background summary is saved on such a model (``single_slot``,
where background summaries give way to turns: busy.py), the view the next turn will
send is sent as the turn's own request (its API's summary shape: the same system
prompt, tools and tool choice, unstreamed) for a single output token, under a lease
that gives way to a turn as the summary's did. A turn arriving meanwhile cancels it;
what the slot read by then stays read, and the turn reads the rest. Nothing here
raises into a request; every outcome is counted (``compaction_proxy_slot_warmups``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from proxy.compaction.busy import BusyModels
from proxy.compaction.summary_api import PATHS
from proxy.core.outcome import Outcome, Turn
from proxy.errors import UpstreamError
from proxy.upstream.seam import Upstream
from proxy.upstream.urls import upstream_url

if TYPE_CHECKING:
    from proxy.observe.metrics import Metrics

log = logging.getLogger("proxy.compaction")
# The warm-up's own header: an upstream's logs (and the simulator) tell it from a turn.
PURPOSE = (b"x-compaction-purpose", b"warm")
WARMUP_OUTCOMES = ("warmed", "gave_way", "failed", "unsupported")


async def warm_slot(
    client: Upstream, base_url: str, turn: Turn, outcome: Outcome, busy: BusyModels
) -> str:
    """Send ``outcome``'s view (a compaction of ``turn``'s session just saved) as
    ``turn``'s own request for one token, giving way to any turn on its model; the
    outcome to count. Cancelled (``CancelledError``) when a turn takes the slot."""
    api, data = turn.api, turn.data
    if api is None or data is None or outcome.messages is None or api.name not in PATHS:
        return "unsupported"
    shaped = api.summary_body(data, outcome.messages, 1)
    if shaped is None:  # a forced tool: the API has no unforced shape of the request
        return "unsupported"
    url = upstream_url(base_url, PATHS[api.name], b"")
    headers = [*turn.auth_headers, (b"content-type", b"application/json"), PURPOSE]
    with busy.summarizing(turn.chat["model"], yields=True):
        try:
            response = await client.send("POST", url, headers, shaped[0])
            try:
                await response.aread_at_most(64 * 1024)  # one token's answer
            finally:
                await response.aclose()
        except UpstreamError as exc:
            log.info("slot warm-up failed (%s)", type(exc).__name__)
            return "failed"
    return "warmed" if response.status_code == 200 else "failed"


async def warmed(
    client: Upstream, base_url: str, turn: Turn, outcome: Outcome, busy: BusyModels
) -> str:
    """``warm_slot`` in a task of its own, which a turn's ``give_way`` cancels (not the
    background run around it, whose compaction is saved): its outcome, ``gave_way`` when
    cancelled so. Cancelling the caller cancels it too."""
    task = asyncio.create_task(warm_slot(client, base_url, turn, outcome, busy))
    try:
        await asyncio.wait([task])
    finally:
        task.cancel()
        busy.gave_way.discard(task)  # give_way's note of it, which nothing else clears
    if task.cancelled():
        return "gave_way"
    failure = task.exception()
    if failure is not None:  # nobody to raise to: logged (its type only) and counted
        log.warning("slot warm-up failed: %s", type(failure).__name__)
        return "failed"
    return task.result()


def count_warmup(metrics: Metrics, outcome: str) -> None:
    metrics.slot_warmups.labels(outcome=outcome).inc()
