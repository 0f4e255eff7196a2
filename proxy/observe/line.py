"""A request's access line: its fields, from what its record held when it ended.

``Recorder.finish`` (recorder.py) gathers a finished record's values in one tuple
(``gathered``: one C call reads the record's attributes) and hands it to the log
writer (logs.py), whose thread makes the line's fields of it (``AccessLine.fields``)
and formats them with the other lines of its batch: the request path pays for the
gathering only. What is gathered is immutable (strings, numbers, frozen values): a
record noted on after it ended (a late summary) does not change its line.

The fields: hashed ids, never content, credentials or header values.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from proxy.core.ledger import Entry, Ledgered, net

if TYPE_CHECKING:
    from proxy.observe.record import Record

# The record's values a line reads, in this order (``AccessLine.fields`` unpacks them).
_RECORD = attrgetter(
    "request_id",
    "method",
    "route",
    "status",
    "path",
    "error",
    "upstream_status",
    "upstream_s",
    "upstream_request_id",
    "event_stream",
    "ttfb_s",
    "completed",
    "model",
    "stream",
    "tenant",
    "session",
    "session_header",
    "outcome",
    "tokens_before",
    "trigger",
    "summary_s",
    "summary_failed_s",
    "cache_plan",
)
# Of a record's outcome, what its line reads: its figures, not the view it holds (a
# queued line must not pin the request's conversation while stderr is slow).
_OUTCOME = attrgetter(
    "status", "degraded", "tokens", "counted", "shadow", "recalled", "tool_rounds"
)
_OUTCOME_AT = 17  # the outcome's place in _RECORD's values
# A finished request's line as gathered: the record's values, its duration, a named
# session's log id (looked up on the loop: the look-up's cache is not the thread's),
# and the ledger's figures and money saved.
Gathered = tuple[tuple[Any, ...], float, str | None, Ledgered | None]
# Each ledger figure's name on the line, in Figures' order (Entry.as_dict's keys, net apart).
_LEDGER_FIELDS = tuple(f"ledger_{k}" for k in Entry().as_dict() if k != "net")

# OpenAI's API resources: a passthrough line names one of these, or "other". The rest of
# a path is the caller's (file ids, names, anything a client puts there), logged only
# with logging.include_sensitive.
_RESOURCES = frozenset(
    "assistants audio batches chat completions containers conversations embeddings evals "  # noqa: SIM905
    "files fine_tuning images models moderations realtime responses threads uploads "
    "vector_stores".split()
)
# The most of one client-chosen value a line copies (a path, a model or session name):
# parsing caps names below this by default, but a path is only bounded by the request
# head (64 KiB), and the caps are configurable: a line stays a line.
LOGGED_VALUE_CHARS = 1024


class _Clipped(str):
    """A value ``clipped`` already (when it was gathered): clipped again, it is itself."""

    __slots__ = ()


def clipped(value: str) -> str:
    """``value``, cut to ``LOGGED_VALUE_CHARS`` with a mark of how long it was."""
    if len(value) <= LOGGED_VALUE_CHARS or type(value) is _Clipped:
        return value
    return f"{value[:LOGGED_VALUE_CHARS]}…({len(value)} chars)"


# The client-chosen strings a line may copy (path, model, session header), by place in
# _RECORD's values: one longer than a line copies is clipped when gathered, so a queued
# line holds at most that much of it (a path may be 64 KiB). The path's API resource
# (api_resource) is the same of the clipped path: a resource's name ends within its
# first 20 characters, and the mark adds no "/".
_CLIPPED_AT = (4, 12, 16)


def api_resource(path: str) -> str:
    """``/v1/files/file-abc/content`` -> ``/v1/files/…``; an unknown resource -> ``other``."""
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[1] != "v1" or parts[2] not in _RESOURCES:
        return "other"
    return f"/v1/{parts[2]}" + ("/…" if len(parts) > 3 else "")


def gathered(
    rec: Record,
    total: float,
    named: str | None = None,
    ledgered: Ledgered | None = None,
) -> Gathered:
    """What ``rec``'s line is made of, as it ended ``total`` seconds after it started."""
    values = _RECORD(rec)
    outcome = values[_OUTCOME_AT]
    if outcome is not None:
        values = (*values[:_OUTCOME_AT], _OUTCOME(outcome), *values[_OUTCOME_AT + 1 :])
    path, model, header = values[4], values[12], values[16]
    if (
        len(path) > LOGGED_VALUE_CHARS
        or (model is not None and len(model) > LOGGED_VALUE_CHARS)
        or (header is not None and len(header) > LOGGED_VALUE_CHARS)
    ):
        values = _long_values_clipped(values)
    return (values, total, named, ledgered)


def _long_values_clipped(values: tuple[Any, ...]) -> tuple[Any, ...]:
    held = list(values)
    for at in _CLIPPED_AT:
        value = held[at]
        if value is not None and len(value) > LOGGED_VALUE_CHARS:
            held[at] = _Clipped(clipped(value))
    return tuple(held)


class AccessLine:
    """Makes a line's fields of what was gathered; safe on any thread (it reads its
    argument and its own setting only)."""

    __slots__ = ("_include_sensitive",)

    def __init__(self, include_sensitive: bool) -> None:
        self._include_sensitive = include_sensitive

    def fields(self, line: Gathered) -> dict[str, Any]:
        """The line's fields, in the order it has always written them."""
        values, total, named, ledgered = line
        (request_id, method, route, status, path, error, upstream_status, upstream_s) = values[:8]
        upstream_request_id, event_stream, ttfb_s, completed, model = values[8:13]
        fields: dict[str, Any] = {
            "request_id": request_id,
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": round(total * 1000, 2),
        }
        if route == "passthrough":  # other paths can hold a session id
            fields["path"] = clipped(path) if self._include_sensitive else api_resource(path)
        if error is not None:
            fields["error"] = error
        if upstream_status is not None:
            fields["upstream_status"] = upstream_status or None
            fields["upstream_ms"] = round(upstream_s * 1000, 2)
        if upstream_request_id is not None:
            fields["upstream_request_id"] = upstream_request_id
        if event_stream:
            if ttfb_s is not None:
                fields["ttfb_ms"] = round(ttfb_s * 1000, 2)
            fields["completed"] = completed
        if model is not None:
            self._chat_fields(values, named, fields)
        if ledgered is not None:  # the ledger's entry, flat: ledger_net, ledger_sent...
            figures, money, cache = ledgered
            fields.update(zip(_LEDGER_FIELDS, figures))  # noqa: B905 (as_dict's, unbuilt)
            fields["ledger_net"] = net(figures)
            if money is not None:
                fields["ledger_money_saved_usd"] = round(money, 6)
            if cache is not None:  # its prompt cache's outcome, and who made a prefix change
                fields["ledger_cache"] = cache[0]
                if cache[1] != "none":
                    fields["ledger_cache_cause"] = cache[1]
        return fields

    def _chat_fields(self, values: tuple[Any, ...], named: str | None, fields: Any) -> None:
        model, stream, tenant, session, session_header, outcome = values[12:18]
        tokens_before, trigger, summary_s, summary_failed_s, cache_plan = values[18:]
        fields["model"] = model if len(model) <= LOGGED_VALUE_CHARS else clipped(model)
        fields["stream"] = stream
        # The same ids /admin/sessions shows for tenants, and every other line for sessions.
        fields["tenant"] = tenant[:12]
        if session is not None:
            fields["session"] = session.log_id
        elif session_header:
            fields["session"] = named
        if self._include_sensitive and session_header is not None:
            fields["session_header"] = clipped(session_header)
        if outcome is not None:  # _OUTCOME's values
            _outcome_fields(outcome, tokens_before, fields)
        if trigger is not None:
            fields["trigger"] = trigger
        if summary_s is not None:
            fields["summary_ms"] = round(summary_s * 1000, 2)
        if summary_failed_s:
            fields["summary_failed_ms"] = round(summary_failed_s * 1000, 2)
        if cache_plan is not None:  # held, or why a newer snapshot was applied (held.py)
            fields["cache_plan"] = cache_plan


def _outcome_fields(outcome: tuple[Any, ...], tokens_before: int | None, fields: Any) -> None:
    """The view's fields (``_OUTCOME``'s values) of a chat request's line."""
    status, degraded, tokens, counted, shadow, recalled, tool_rounds = outcome
    fields["compaction"] = status
    if degraded is not None:
        fields["degraded"] = degraded
    fields["tokens_before"] = tokens if tokens_before is None else tokens_before
    fields["tokens_after"] = tokens
    fields["counted"] = counted
    if recalled is not None:  # excerpts of archived originals (recall.py)
        fields["recalled"] = recalled
    if tool_rounds is not None:  # the recall tool's calls answered (recall_tool.py)
        fields["recall_tool"] = tool_rounds
    if shadow is not None:  # what shadow mode would have sent instead
        fields.update(shadow_status=shadow.status, shadow_version=shadow.version)
        fields.update(shadow_tokens=shadow.tokens, shadow_saved=shadow.saved)
