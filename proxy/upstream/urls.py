"""Upstream URLs: the proxy's own paths, and a client's path checked before it is
forwarded (``passthrough_url``), so nothing resolves outside the configured base.
"""

from __future__ import annotations

from contextlib import suppress
from functools import cache, lru_cache
from urllib.parse import quote, unquote_to_bytes

from yarl import URL

from proxy.errors import InvalidRequest

# RFC 3986 pchar, "/" and "%": the only bytes a passthrough path may carry on the wire.
_PATH_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/%"
# Bytes a decoded path must not hold: "%" would decode again (%252e -> %2e -> .),
# "\\" is a separator to some servers, ";" starts path parameters that servlet
# containers strip ("..;" is ".." there), controls can split or truncate the request.
_UNSAFE_DECODED = bytes(range(0x20)) + b"\x7f%\\;"
# Printable ASCII but "#": a query is relayed byte for byte and must stay one.
_QUERY_BYTES = bytes(b for b in range(0x21, 0x7F) if b != ord("#"))
_BAD_PATH = "Invalid path: only plain paths under /v1/ are forwarded."


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """``base_url`` + a path of the proxy's own choosing (never a client's: see
    ``passthrough_url``)."""
    url = base_url.rstrip("/") + "/" + path.lstrip("/")
    return f"{url}?{query.decode('latin-1')}" if query else url


@cache
def api_url(base_url: str, path: str) -> str:
    """An API's endpoint (``Api.path``) under ``base_url``: the same few every request."""
    return upstream_url(base_url, path, b"")


def passthrough_url(base_url: str, path: str, raw_path: bytes | None, query: bytes) -> URL:
    """``base_url`` + the client's path after ``/v1``, as the client encoded it.

    Raises ``InvalidRequest`` for anything that could resolve outside ``base_url``'s
    path, here or at the upstream: dot segments, encoded separators or dots that a
    second decoding would turn into them, backslashes, controls. The URL is marked
    encoded, so neither yarl nor aiohttp normalises it again.
    """
    raw = raw_path if raw_path is not None else quote(path).encode("ascii")
    if not raw.startswith(b"/v1/") or raw.translate(None, _PATH_BYTES):
        raise InvalidRequest(_BAD_PATH, code="invalid_path")
    decoded = unquote_to_bytes(raw)
    segments = decoded.split(b"/")
    if (
        len(decoded.translate(None, _UNSAFE_DECODED)) != len(decoded)
        or b".." in segments
        or b"." in segments
        # What the router matched must be what is forwarded (it differs on invalid UTF-8).
        or decoded != path.encode("utf-8", "surrogatepass")
    ):
        raise InvalidRequest(_BAD_PATH, code="invalid_path")
    if query.translate(None, _QUERY_BYTES):
        raise InvalidRequest("Invalid query string.", code="invalid_path")
    url = _base_path(base_url) + raw[3:].decode("ascii")
    if query:
        url = f"{url}?{query.decode('ascii')}"
    return URL(url, encoded=True)


@lru_cache(maxsize=4)
def _base_path(base_url: str) -> str:
    # The configured base, encoded once; the client's path is appended verbatim.
    return str(URL(base_url)).rstrip("/")


@lru_cache(maxsize=256)
def plain_url(url: str | URL) -> URL | None:
    """``url`` if it is http(s) with a host and no credentials (the HTTP client would turn
    them into an Authorization header), else None; remembered, as calls repeat their URL."""
    with suppress(ValueError):  # (else the HTTP client raises its own error for it)
        url = URL(url)
        if url.scheme in ("http", "https") and url.raw_host:
            return url if (url.raw_user, url.raw_password) == (None, None) else None
    return None
