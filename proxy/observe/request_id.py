"""Request ids: the client's ``X-Request-Id`` when well-formed, else a new one.

The id a request is served under goes on its headers (so it is forwarded upstream
like any other header), on the summary calls it makes, on its response and on
every log line written for it. The response's ``X-Request-Id`` is always ours: an
upstream's own id on a relayed answer is renamed ``X-Upstream-Request-Id``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from itertools import count

HEADER = b"x-request-id"
UPSTREAM_HEADER = b"x-upstream-request-id"
_CONTENT_TYPE = b"content-type"
# What a client's id may be: bounded, and nothing that could break a log line or a header.
_VALID = re.compile(rb"[A-Za-z0-9._:+=/@-]{1,128}")

Headers = list[tuple[bytes, bytes]]


class _Ids:
    """32 hex digits: 64 random bits drawn once per process, then a counter. Unique
    across workers and replicas without a system call per request (``os.urandom`` was
    one, a measurable share of the passthrough's CPU: bench/README.md); an id is a
    label, not a secret."""

    prefix = ""
    counter = count()

    @classmethod
    def reseed(cls) -> None:
        # After a fork too: a worker must not count from its supervisor's prefix.
        cls.prefix = os.urandom(8).hex()
        cls.counter = count()


_Ids.reseed()
os.register_at_fork(after_in_child=_Ids.reseed)


def new_request_id() -> str:
    return f"{_Ids.prefix}{next(_Ids.counter):016x}"


def request_id_from(headers: Headers) -> tuple[str, Headers]:
    """The request's id, and its headers carrying exactly that id once."""
    for name, _ in headers:
        if name == HEADER:
            break
    else:  # most requests: none given, a new one added (a copy: the list is uvicorn's)
        request_id = new_request_id()
        return request_id, [*headers, (HEADER, request_id.encode("ascii"))]
    given = [value for name, value in headers if name == HEADER]
    if len(given) == 1 and _VALID.fullmatch(given[0]):
        return given[0].decode("ascii"), headers
    valid = [value for value in given if _VALID.fullmatch(value)]
    request_id = valid[0].decode("ascii") if valid else new_request_id()
    kept = [header for header in headers if header[0] != HEADER]
    kept.append((HEADER, request_id.encode("ascii")))
    return request_id, kept


def response_headers(
    headers: Iterable[tuple[bytes, bytes]], own: tuple[bytes, bytes]
) -> tuple[Headers, str | None, bool]:
    """``headers`` with our id (``own``) once; the upstream's own id, if it sent a
    well-formed one; whether the response is an event stream (noted in the same pass)."""
    if type(headers) is not list:  # an ASGI app may send any iterable: read it once
        headers = list(headers)
    event_stream = False
    for name, value in headers:
        if len(name) == 12:  # both names below are 12 bytes: most headers skip the lower()
            lowered = name.lower()
            if lowered == HEADER:  # an id of the upstream's: renamed (or dropped), below
                return _renamed(headers, own)
            if lowered == _CONTENT_TYPE and value[:17].lower() == b"text/event-stream":
                event_stream = True
    return [*headers, own], None, event_stream  # most answers: ours added, in one copy


def _renamed(
    headers: Iterable[tuple[bytes, bytes]], own: tuple[bytes, bytes]
) -> tuple[Headers, str | None, bool]:
    out = []
    upstream_id = None
    event_stream = False
    for name, value in headers:
        if len(name) == 12:
            lowered = name.lower()
            if lowered == HEADER:
                if value != own[1]:  # the upstream's own id (an echo of ours is dropped)
                    out.append((UPSTREAM_HEADER, value))
                    if _VALID.fullmatch(value):
                        upstream_id = value.decode("ascii")
                continue
            if lowered == _CONTENT_TYPE and value[:17].lower() == b"text/event-stream":
                event_stream = True
        out.append((name, value))
    out.append(own)
    return out, upstream_id, event_stream
