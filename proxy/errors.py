"""The proxy's exception tree, and how each one looks on the wire.

```
ProxyError                      -> OpenAI-shaped JSON error body
  ConfigError                   bad configuration (start-up only)
  InvalidRequest        400     the client's request cannot be handled
    ContextTooLarge     400     the newest message alone cannot fit the window (core/trim.py,
                                before the call or on an overflow's retry; upstream/recover.py)
  MissingCredential     401     no caller key where server.require_client_key applies
  PayloadTooLarge       413     body over server.max_body_bytes
  UnsupportedEncoding   415     a chat body with a Content-Encoding (gzip, br...)
  NotFound              404     unknown session / route
  Overloaded            503     over server.max_inflight_body_bytes (with Retry-After)
  RateLimited           429     POST /sessions/{id}/compact again within force_interval_s
  ClientDisconnected    499     the client went away before its answer (nothing is sent)
  StoreError                    the snapshot store failed (never reaches a client)
  SummaryError                  summarization failed (never reaches a client)
    SummaryTruncated            the summary was cut off by its token limit, even when retried
    SummaryRejected             the summary check refused it, even when retried
    SummaryOversize             the answer's bytes were far over what its token limit allows
  UpstreamError
    UpstreamUnavailable 502     connect failure, or the connection lost before the headers
    UpstreamTimeout     504     no answer within upstream.timeout_s
    UpstreamStreamBroken 502/504 the body broke off (or timed out) after the headers came
```

Everything a client sees from the proxy itself uses OpenAI's error JSON shape
(``{"error": {"message", "type", "param", "code"}}``) so SDKs raise the
matching exception class. Upstream errors are relayed unchanged and never
pass through here.
"""

from __future__ import annotations

from typing import Any

import orjson


class ProxyError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        err: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        return orjson.dumps({"error": err})


class ConfigError(ProxyError):
    pass


class InvalidRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


def check_length(value: str, limit: int, param: str) -> None:
    """A 400 naming ``param`` when ``value`` is longer than ``limit`` bytes of UTF-8.

    For the strings the proxy keys anything by (model and session names): with their
    length bounded here, a table bounded in entries is bounded in bytes too."""
    # Characters never outnumber UTF-8 bytes: only a short non-ASCII string is encoded.
    if len(value) > limit or (not value.isascii() and len(value.encode()) > limit):
        raise InvalidRequest(
            f"Invalid '{param}': string too long. Expected a string of at most {limit} "
            "bytes (this proxy's limit).",
            param=param,
            code="string_above_max_length",
        )


class MissingCredential(ProxyError):
    status = 401
    type = "invalid_request_error"
    code = "missing_api_key"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedEncoding(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Overloaded(ProxyError):
    """This process holds all the request bodies it may: come back in a moment."""

    status = 503
    type = "server_error"
    code = "server_overloaded"
    retry_after_s = 1  # bodies in flight are typically read and answered within seconds


class RateLimited(ProxyError):
    status = 429
    type = "requests"  # OpenAI's own for a 429
    code = "rate_limit_exceeded"


class ClientDisconnected(ProxyError):
    status = 499  # nginx's "client closed request": nobody receives it
    type = "client_closed_request"


class StoreError(ProxyError):
    pass


class SummaryError(ProxyError):
    # Why each answer of this summary was not kept (summary_check.Reason), for metrics.
    rejected: tuple[str, ...] = ()
    calls: int = 0  # summary calls the failed summary made


class SummaryTruncated(SummaryError):
    length_retries: int = 1  # calls retried for length before giving up


class SummaryRejected(SummaryError):
    pass


class SummaryTimedOut(SummaryError):
    pass  # compaction.summary_timeout_s passed: what it was allowed teaches pace.py


class SummaryTooSlow(SummaryError):
    pass  # not asked: the summarizer is known to write too little in the time there is


class SummaryOversize(SummaryError):
    posts: int = 1  # calls its answer took: 2 when asked again within a stated output limit


class UpstreamError(ProxyError):
    status = 502
    type = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    status = 502
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamStreamBroken(UpstreamError):
    """The connection broke or timed out while the body was read, after the status and
    headers had arrived. A relayed stream can only end early then; before any byte
    reached the client, it is answered like the failure behind it (504 for a timeout)."""

    status = 502
    code = "upstream_unavailable"

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message, code="upstream_timeout" if timed_out else None)
        if timed_out:
            self.status = UpstreamTimeout.status


class ContextTooLarge(InvalidRequest):
    code = "context_length_exceeded"


def upstream_failure(exc: BaseException, *, body: bool) -> UpstreamError:
    """The one place the HTTP client's exceptions (upstream/client.py) become the proxy's;
    callers raise the result ``from exc`` (a function, not a mapping context manager: a
    ``with`` costs on every use, a ``try`` nothing until something fails). ``body``: the
    status and headers had already arrived, so the failure broke a body off, which a
    relayed stream can only end early on."""
    timed_out = isinstance(exc, TimeoutError)  # asyncio's, aiohttp's ServerTimeoutError
    if body:
        message = (
            "The upstream did not finish its answer in time."
            if timed_out
            else "The upstream connection broke mid-answer."
        )
        return UpstreamStreamBroken(message, timed_out=timed_out)
    if timed_out:
        return UpstreamTimeout("The upstream did not answer in time.")
    return UpstreamUnavailable("The upstream could not be reached.")
