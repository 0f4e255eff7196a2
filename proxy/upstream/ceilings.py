"""Output ceilings learned from upstream output-budget errors, and requests clamped to them.

A client that always asks ``max_tokens: 32000`` of a model that allows fewer is refused
with a 400 that states the limit ("This model supports at most 4096 completion tokens");
recovery (``pipeline._second_attempt``) lowers the budget and retries. Without memory that
is a refusal and a second call on every turn. So the stated limit is learned as windows are
(``windows.py``: per upstream and model, for the tenant at once, for everyone once a quorum
of tenants agrees, with the same expiry), and a later request asking for more is clamped to
it before it is sent; its answer says so (``X-Compaction-Output-Clamped``).

Only a limit the upstream stated as the model's output limit is learned: Anthropic's
"input length and `max_tokens` exceed context limit", which recovery also answers with a
lower budget, depends on the prompt's length and is never kept.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from proxy.core.outcome import Turn
from proxy.upstream.api import Api, Attempt
from proxy.upstream.overflow import Overflow
from proxy.upstream.windows import LearnedWindows

# A body this large is re-encoded off the event loop (a clamp rewrites the request).
_INLINE_BYTES = 256 * 1024


class LearnedCeilings(LearnedWindows):
    """The output limit each model was refused above, shared as ``LearnedWindows``
    shares windows (the metrics: ``compaction_proxy_learned_output_limits``)."""

    NOUN = "output limit"
    FLOOR = 1
    PREFIX = "c1|"  # a key layout of its own: never read as a window (parse_window_key)

    async def ceiling(self, model: str, tenant: str) -> int | None:
        """The smallest output limit learned for ``model`` (everyone's or ``tenant``'s);
        from this replica's few-second copy when it has one (nearly always)."""
        read, learned = self._recent(model, tenant)
        return learned if read else await self.get(model, tenant)

    async def budget_retry(
        self, api: Api, turn: Turn, first: Attempt, verdict: Overflow
    ) -> tuple[Overflow, Attempt | None]:
        """``verdict`` (an upstream's refusal of ``first``) as ``api`` reads it and, when it
        refuses the output budget, ``first`` with a budget the model allows (None: nothing
        to lower). An output limit stated as the model's is learned on the way."""
        if verdict.kind == "output_budget" and verdict.limit:
            limit, configured = verdict.limit, turn.model.context_window
            await self.learn(
                turn.model.name, limit, turn.tenant, configured=configured, stated=limit
            )
        verdict = api.as_budget(verdict)  # Messages: a budget refusal worked out, not stated
        if verdict.kind != "output_budget":
            return verdict, None
        return verdict, await self.lower(api, turn, first, verdict)

    async def clamp(self, api: Api, turn: Turn, first: Attempt) -> Attempt:
        """``first`` with its output budget lowered to the ceiling learned for its model,
        when it asks for more (its outcome then says to what, and it is counted); else
        ``first`` as it was."""
        asked = asked_output(turn)
        if asked is None:
            return first
        limit = await self.ceiling(turn.model.name, turn.tenant)
        if limit is None or asked <= limit:
            return first
        clamped = await self.lower(api, turn, first, Overflow("output_budget", limit=limit))
        if clamped is None:
            return first
        self._metrics.models.clamped.inc()
        return clamped

    async def lower(
        self, api: Api, turn: Turn, attempt: Attempt, verdict: Overflow
    ) -> Attempt | None:
        """``attempt`` (of ``turn``) with the output budget ``verdict`` allows, said in its
        outcome (``X-Compaction-Output-Clamped``); None when that changes nothing."""
        if len(attempt.body) > _INLINE_BYTES:
            body = await asyncio.to_thread(api.lower_output, attempt.body, verdict)
        else:
            body = api.lower_output(attempt.body, verdict)
        if body is None:
            return None
        # No limit stated: the API's lower_output halved what was asked.
        limit = verdict.limit or (asked_output(turn) or 0) // 2
        return replace(attempt, body=body, outcome=replace(attempt.outcome, clamped=limit))

    def _counted(self, scope: str, model: str, tokens: int) -> None:
        self._metrics.models.learned_outputs.labels(scope=scope).inc()


def asked_output(turn: Turn) -> int | None:
    """The output budget the request asks for, in its chat view (``max_tokens`` there for
    every API), if it sets one."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = turn.chat.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
