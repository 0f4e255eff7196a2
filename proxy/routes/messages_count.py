"""``POST /v1/messages/count_tokens``: relayed untouched, with the compacted view's size.

The upstream counts the history the client sends; the next ``/v1/messages`` request of
that history goes upstream as the session's view (pinned + summary + tail). The answer
carries, besides the upstream's own count, what the proxy counts of that view:

* ``X-Compaction-View-Tokens``: the view's tokens in the proxy's count, as the next
  request's ``X-Context-Tokens`` would say (its output budget apart);
* ``X-Compaction-View-Version``: the session's snapshot it is rebuilt under (0: none
  applies, and the count is of the history as sent);
* ``X-Compaction-View-Status``: ``snapshot`` (rebuilt), ``passthrough`` (no snapshot
  applies), ``bypassed`` (the next request would go untouched: ``X-Compaction: off``,
  a ``compact_*`` edit, compaction disabled: the history as sent, counted) or
  ``due``: the next request would compact (past the trigger, or a compaction the
  session was asked for): when by elision alone, this is its view; when by a new
  summary, its view will be smaller than this one (the current snapshot's).

Read-only, the pipeline's steps 3-8 without their effects: the history counted, the
session's snapshot loaded and the view rebuilt from it; never a summary (nothing waits
for one), never a store write, no pre-compaction, no sighting, no scheduled hint taken.
A failure to work it out (a store unreachable, a body the upstream will refuse) leaves
the headers out of the answer, one log line, never the request failed.
"""

from __future__ import annotations

import logging

from starlette.requests import Request

from proxy.compaction.prepare import locate_turn, measure_turn
from proxy.compaction.schedule import scheduled
from proxy.core.outcome import Turn
from proxy.core.plan import plan_compaction
from proxy.core.rebuild import Handoff, rebuild_outcome
from proxy.core.session import session_name
from proxy.core.snapshot import view_of
from proxy.errors import ProxyError
from proxy.services import Services
from proxy.upstream.api import Api

log = logging.getLogger("proxy.routes")

Headers = list[tuple[bytes, bytes]]


async def view_headers(api: Api, request: Request, services: Services, body: bytes) -> Headers:
    """The headers that size the view of ``api``'s next request (``MESSAGES``, given by
    app.py; the module's doc); none when it cannot be worked out."""
    try:
        tokens, version, status = await _view(api, request, services, body)
    except ProxyError as error:  # a body the proxy would refuse: the upstream says why
        log.info("count_tokens: no view count (%s)", error.code)
        return []
    except Exception as error:
        log.warning("count_tokens: no view count (%s)", type(error).__name__)
        return []
    return [
        (b"x-compaction-view-tokens", str(tokens).encode()),
        (b"x-compaction-view-version", str(version).encode()),
        (b"x-compaction-view-status", status.encode()),
    ]


async def _view(
    api: Api, request: Request, services: Services, body: bytes
) -> tuple[int, int, str]:
    """The view's tokens, its snapshot's version and its status."""
    settings = services.settings
    server = settings.server
    data, chat = api.parse(body, server.max_messages, server.max_model_bytes)
    tenant = services.tenant_ids.of(request.headers)
    model = await services.effective_model(chat["model"], tenant)
    control = request.headers.get("x-compaction", "").strip().lower()
    turn = Turn(
        chat=chat,
        body=body,
        model=model,
        tenant=tenant,
        session_header=session_name(request.headers, data, settings.session),
        auth_headers=[],
        policy=services.policies.policy_for(
            tenant, services.tenant_ids.legacy_of(tenant, request.headers)
        ),
    )
    measured = await measure_turn(turn, services.counters, settings.compaction)  # 5.
    c, history, budget = measured.c, measured.history, measured.budget  # its tenant's policy's
    if control == "off" or api.untouched(data, control) or c.effective_mode == "off":
        whole = rebuild_outcome(history, view_of(None, history.pinned), Handoff(None, 0), budget)
        return whole.tokens, 0, "bypassed"
    loaded = (await locate_turn(turn, measured, services.store, settings.session)).loaded  # 3-4.
    view = loaded.view(history.pinned)
    due = control == "force" or scheduled(loaded.stored)
    plan = plan_compaction(history, view, budget, force=due)  # 6.
    if plan.action == "compact" and plan.summarize[0] == plan.summarize[1]:
        view = plan.view  # elision alone, no summary: the next request's view itself
    outcome = rebuild_outcome(history, view, Handoff.of(loaded, c.summary_role), budget)
    return outcome.tokens, outcome.version, "due" if plan.action == "compact" else outcome.status
