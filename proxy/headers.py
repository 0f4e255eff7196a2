"""Which headers cross the proxy: request headers on their way upstream, and
response headers on their way back.

Hop-by-hop headers (RFC 9110 7.6.1) stop here in both directions; the proxy's
own control headers never reach the upstream; a configured API key replaces
the client's credentials.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from proxy.config import Settings

if TYPE_CHECKING:
    from proxy.upstream import UpstreamResponse

# RFC 9110 7.6.1 hop-by-hop headers, plus what the HTTP client recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_HOP_BY_HOP_RAW = frozenset(h.encode() for h in HOP_BY_HOP)
# The proxy's server writes its own Date and Server on every response; the upstream's
# copies would make two of each (RFC 9110 allows one Date; clients read the first).
_RESPONSE_DROP = _HOP_BY_HOP_RAW | {b"date", b"server"}
CONTROL_HEADERS = frozenset({"x-compaction"})
# The proxy's own header family (x-compaction-purpose marks its summarizer calls):
# a client's copy must never reach the upstream looking like the proxy's.
_CONTROL_PREFIX = "x-compaction-"
# Headers the summarizer's own upstream calls carry: credentials and billing scope.
AUTH_HEADERS = frozenset(
    {b"authorization", b"api-key", b"x-api-key", b"openai-organization", b"openai-project"}
)


class HeaderPolicy:
    """Which request headers go upstream, computed once from settings."""

    def __init__(self, settings: Settings) -> None:
        self.drop = HOP_BY_HOP | CONTROL_HEADERS | {settings.session.header.lower()}
        self._drop_inspect = self.drop | {"accept-encoding"}
        key = settings.upstream.api_key.get_secret_value()
        self.authorization = f"Bearer {key}" if key else None

    def outgoing(
        self, headers: Iterable[tuple[bytes, bytes]], *, inspect: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Headers for the upstream. ``inspect``: the proxy reads the answer (overflow
        errors, usage), so it is asked for uncompressed bytes."""
        headers = list(headers)
        drop = self._drop_inspect if inspect else self.drop
        # RFC 9110 7.6.1: what the client's Connection header names is for this hop only.
        options = [v for k, v in headers if k.lower() == b"connection"]
        if options:
            named = {t.strip().lower() for v in options for t in v.decode("latin-1").split(",")}
            drop = drop | named
        out = []
        for k, v in headers:
            name = k.decode("latin-1").lower()
            if name not in drop and not name.startswith(_CONTROL_PREFIX):
                out.append((k, v))
        if inspect:
            out.append((b"accept-encoding", b"identity"))
        if self.authorization is not None:
            out = [(k, v) for k, v in out if k.lower() != b"authorization"]
            out.append((b"authorization", self.authorization.encode("latin-1")))
        return out

    @staticmethod
    def auth_only(outgoing: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in outgoing if k.lower() in AUTH_HEADERS]


def response_headers(response: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    raw = response.raw_headers
    drop = _RESPONSE_DROP
    # RFC 9110 7.6.1, as for requests: what the upstream's Connection header names
    # was for the proxy's hop only, never the client's.
    options = [v for k, v in raw if k.lower() == b"connection"]
    if options:
        drop = drop | {t.strip().lower() for v in options for t in v.split(b",")}
    return [(k, v) for k, v in raw if k.lower() not in drop]
