"""Recall by tool: on a compacted view of a request that carries tools, one more tool, a
search of the session's archive of originals, which the proxy answers itself before the
client sees a byte.

``RecallTool.offer`` declares it (in the API's own shape: routes/tool_shapes.py) when the
turn's tenant (``compaction.recall_tool_rounds`` above 0) and model
(``models[].recall_tool``) allow it, the
view carries a summary and the archive holds passages; a client that declares a tool of
the same name keeps its own, and nothing is added. ``RecallTool.answer`` reads each upstream answer
whole (a stream too: it is held until it ends, at most ``MAX_ANSWER_BYTES``) and:

- calls no recall tool: relayed as the upstream wrote it, byte for byte;
- calls only the recall tool (text beside the call is the model thinking aloud): each
  call is answered with the excerpts the archive has for its query (core/recall_tool.py),
  the calls and their results appended to the conversation, and the upstream asked again;
  at most ``compaction.recall_tool_rounds`` times, within the room the window leaves;
  then once more with ``tool_choice: none``; a model that still calls it gets a 502;
- calls the recall tool and the client's tools: asked again without the recall tool (and
  without its earlier rounds), so the client gets a turn of its own tools only.

The client sees the last answer's usage; the prompt tokens of the answers consumed are
counted (``compaction_proxy_recall_tool_tokens``), the calls answered are the response's
``X-Compaction-Recall-Tool``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from starlette.background import BackgroundTasks
from starlette.responses import Response

from proxy.compaction.recall import Recall
from proxy.config import CompactionSettings
from proxy.core.excerpts import excerpts_tokens
from proxy.core.outcome import Outcome, Turn
from proxy.core.recall_tool import (
    TOOL_NAME,
    TOOL_TOKENS,
    Call,
    query_of,
    tool_result,
    view_summary,
)
from proxy.core.session import SessionKey
from proxy.core.tokens import TokenCounter, output_reserve
from proxy.errors import UpstreamError
from proxy.observe.metrics.recall_tool import OUTCOMES, RecallToolSeries
from proxy.upstream import client as upstream
from proxy.upstream.api import Attempt, Route, ToolOffer, ToolShape
from proxy.upstream.relay import buffered, relay
from proxy.upstream.seam import Upstream

Watch = Callable[[bytes], None]

log = logging.getLogger("proxy.recall")

# An answer bigger than this is not read for calls: relayed as it came (counted: unread).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# What a call and its result's message cost beside their text, in tokens, at most.
_CALL_TOKENS = 40
# A call's excerpts' share of the window when ``recall_budget_ratio`` is 0: that turns
# excerpts off, not the tool (the key's default).
_RATIO = 0.1


class RecallToolRefused(UpstreamError):
    """The model kept calling the recall tool after it was told to answer."""

    code = "recall_tool_refused"


def wanted(turn: Turn, c: CompactionSettings) -> bool:
    """Whether ``turn`` may get the recall tool, before its view is known: it carries
    tools, and its tenant's settings and its model allow it."""
    return c.recall_tool_rounds > 0 and turn.model.recall_tool and bool(turn.chat.get("tools"))


class RecallTool:
    """Offers the tool and answers its calls from ``recall``'s indexes, asking the
    upstream (``client``) again; counted on ``registry``; a turn's settings are its
    tenant's, else ``settings``; its tokens counted by ``counters`` (by tokenizer)."""

    def __init__(
        self,
        recall: Recall,
        client: Upstream,
        registry: CollectorRegistry,
        settings: CompactionSettings,
        counters: Mapping[str, TokenCounter],
    ) -> None:
        self._recall, self._client = recall, client
        self._series = RecallToolSeries.create(registry)
        self._counted = {o: self._series.outcomes.labels(outcome=o) for o in OUTCOMES}
        self._settings, self._counters = settings, counters

    async def searchable(self, turn: Turn, key: SessionKey, outcome: Outcome) -> Outcome:
        """``outcome`` naming ``key``'s archive for the tool to search, when ``turn`` may
        get the tool and that archive holds anything; else ``outcome``."""
        if not wanted(turn, turn.compaction(self._settings)):
            return outcome
        return await self._recall.searchable(turn, key, outcome)

    def offer(
        self, shape: ToolShape | None, turn: Turn, outcome: Outcome, data: dict[str, Any]
    ) -> tuple[ToolOffer, dict[str, Any], Outcome] | None:
        """The offer for ``turn``'s view ``outcome``, the request object declaring the
        tool and the view counted with it; None when the tool is not for this request."""
        if shape is None or outcome.archive is None or outcome.messages is None:
            return None
        c = turn.compaction(self._settings)
        if not wanted(turn, c):
            return None
        if TOOL_NAME in shape.declared(data):  # the client's own tool of that name wins
            self._counted["client_tool"].inc()
            return None
        reserve = output_reserve(turn.chat, turn.model.max_output_tokens)
        if outcome.tokens + TOOL_TOKENS + reserve > outcome.window:
            return None  # no room for even its definition
        self._counted["offered"].inc()
        tooled = replace(outcome, tokens=outcome.tokens + TOOL_TOKENS, tool_rounds=0)
        counter = self._counters[turn.model.tokenizer]
        return ToolOffer(shape, data, c, counter, reserve), shape.declare(data), tooled

    async def answer(
        self,
        route: Route,
        sent: Attempt,
        response: upstream.UpstreamResponse | Response,
        watch_for: Callable[[Outcome], Watch | None],
    ) -> tuple[upstream.UpstreamResponse | Response, Attempt]:
        """The response for the client to ``sent``'s ``response``, and the attempt it
        answers (its outcome's ``tool_rounds`` the calls answered, its tokens what the
        last request carried); ``response`` itself when the tool is not in play (an
        error answer, a view without it): see the module's doc. A model's answer read
        whole starts ``sent``'s follow-ups once it is out. ``watch_for``: the usage
        watcher for the view an answer relayed answers (after calls answered, one that
        does not calibrate: the count is an upper bound)."""
        offered = route.tool
        if not isinstance(response, upstream.UpstreamResponse) or response.status_code != 200:
            return response, sent  # an error read, or a stream held (recover.py)
        if offered is None:
            return response, sent
        answer, sent = await self._rounds(offered, route, sent, response, watch_for)
        if not isinstance(answer, upstream.UpstreamResponse) and sent.follow_ups:
            tasks = BackgroundTasks()  # as relay.run_after: after its own, in order
            for task in (answer.background, *sent.follow_ups):
                if task is not None:
                    tasks.add_task(task)
            answer.background = tasks
        return answer, sent

    async def _rounds(
        self,
        offered: ToolOffer,
        route: Route,
        sent: Attempt,
        response: upstream.UpstreamResponse,
        watch_for: Callable[[Outcome], Watch | None],
    ) -> tuple[upstream.UpstreamResponse | Response, Attempt]:
        shape, c, counted = offered.shape, offered.c, self._counted
        outcome = sent.outcome
        body = sent.body
        rounds = asked = 0  # calls answered; times asked again with their results
        tokens = outcome.tokens
        told = False  # asked with tool_choice: none
        while True:
            raw, rest = await response.aread_or_rest(MAX_ANSWER_BYTES)
            done = _with(sent, rounds, tokens)
            encoded = response.headers.get("content-encoding", "identity") != "identity"
            if rest is not None or encoded:  # not read whole: passed on as it is
                counted["unread"].inc()
                if rest is None:
                    return buffered(response, raw), done
                return await relay(response, (), _watch(watch_for, done), started=(raw, rest)), done
            calls = _calls(shape, raw, _is_stream(response))
            ours = [call for call in calls if call.name == TOOL_NAME]
            if not ours:
                raw = shape.scrub(raw, _is_stream(response), offered.data)
                _watched(_watch(watch_for, done), raw)
                return buffered(response, raw), done
            used = route.api.prompt_tokens(raw)
            if used is not None:
                self._series.tokens.inc(used)
            if len(ours) < len(calls):  # the client's tools too: a turn of its own tools only
                counted["mixed"].inc()
                done = _with(sent, rounds, outcome.tokens - TOOL_TOKENS)  # the tool's own off
                return await self._without_tool(offered, route, done, watch_for)
            if told:
                counted["refused"].inc()
                log.warning("the model kept calling the recall tool after tool_choice none")
                raise RecallToolRefused(
                    "The model kept calling the proxy's recall tool after it was asked to answer."
                )
            room = outcome.window - offered.reserve - tokens
            cost = sum(offered.counter.text(call.arguments) + _CALL_TOKENS for call in ours)
            if asked >= c.recall_tool_rounds or cost >= room:
                counted["exhausted"].inc()
                told = True
                body = orjson.dumps(shape.no_more_calls(orjson.loads(body)))
            else:
                results, tokens = await self._results(offered, outcome, ours, (tokens, cost))
                rounds += len(ours)
                asked += 1
                counted["answered"].inc(len(ours))
                body = orjson.dumps(shape.continued(orjson.loads(body), ours, results))
            response = await self._client.send("POST", route.url, route.headers, body)
            if response.status_code != 200:  # the upstream's own error, as it wrote it
                return response, _with(sent, rounds, tokens)

    async def _results(
        self, offered: ToolOffer, outcome: Outcome, ours: list[Call], spent: tuple[int, int]
    ) -> tuple[list[str], int]:
        """Each of ``ours`` answered from the archive within the room the view leaves
        (``spent``: its tokens so far, and the calls' own): the results, and the view's
        tokens with the calls and their results."""
        tokens, cost = spent
        room = outcome.window - offered.reserve - tokens
        tokens += cost
        share = int(outcome.window * (offered.c.recall_budget_ratio or _RATIO))
        results, summary = [], view_summary(outcome.messages)
        for call in ours:
            query, budget = query_of(call.arguments, summary), min(share, room - cost)
            found = await self._recall.search(outcome, query, offered.counter, budget)
            results.append(tool_result(found))
            tokens += excerpts_tokens(found) if found else _CALL_TOKENS
            room = outcome.window - offered.reserve - tokens
        return results, tokens

    async def _without_tool(
        self,
        offered: ToolOffer,
        route: Route,
        sent: Attempt,
        watch_for: Callable[[Outcome], Watch | None],
    ) -> tuple[upstream.UpstreamResponse | Response, Attempt]:
        """The turn asked again without the recall tool (the model called the client's
        tools beside it: those are the client's to run), its answer relayed as it comes;
        ``sent``: the attempt that answers, counted without the tool."""
        body = route.api.body_for(route.body, offered.data, sent.outcome)
        response = await self._client.send("POST", route.url, route.headers, body)
        if response.status_code != 200:
            return response, sent
        return await relay(response, (), _watch(watch_for, sent)), sent


def _with(sent: Attempt, rounds: int, tokens: int) -> Attempt:
    return replace(sent, outcome=replace(sent.outcome, tool_rounds=rounds, tokens=tokens))


def _watch(watch_for: Callable[[Outcome], Watch | None], sent: Attempt) -> Watch | None:
    outcome = sent.outcome
    return watch_for(outcome if not outcome.tool_rounds else replace(outcome, counted=False))


def _watched(watch: Watch | None, raw: bytes) -> None:
    if watch is not None:
        watch(raw)


def _calls(shape: ToolShape, raw: bytes, streamed: bool) -> list[Call]:
    if streamed:
        return shape.stream_calls(raw)
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return shape.calls(parsed) if isinstance(parsed, dict) else []


def _is_stream(response: upstream.UpstreamResponse) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")
