"""Which headers cross the proxy: request headers on their way upstream, and
response headers on their way back.

Hop-by-hop headers (RFC 9110 7.6.1) stop here in both directions; the proxy's
own control headers never reach the upstream; a configured API key replaces
the client's credentials, and its other credential and origin headers stay here
(``LENT_KEY_DROP``) unless ``upstream.forward_client_headers`` names them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from proxy.config import Settings

if TYPE_CHECKING:
    from proxy.upstream.client import UpstreamResponse

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
        # Answered by the proxy's own server (its 100 Continue); forwarded, aiohttp would hold
        # the body until the upstream sent one too (tests/upstream/test_expect_continue.py).
        "expect",
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
# Headers the summarizer's own upstream calls carry: credentials and billing scope, and
# the Messages API's version (Anthropic refuses a call without it) and betas (a summary
# asked as the turn's own request keeps the fields they enable: summary_prefix.py).
AUTH_HEADERS = frozenset(
    {
        b"authorization",
        b"api-key",
        b"x-api-key",
        b"openai-organization",
        b"openai-project",
        b"anthropic-version",
        b"anthropic-beta",
    }
)


# What a caller says about itself that must not ride on the proxy's own key: its own
# credentials and billing scope (the upstream would read them next to the lent key),
# and where it came from (a client forges these at will; the proxy cannot tell a
# trusted hop's copy from one, and adds none of its own).
LENT_KEY_DROP = frozenset(
    {
        "api-key",
        "x-api-key",
        "openai-organization",
        "openai-project",
        "forwarded",
        "x-real-ip",
    }
)
_LENT_KEY_DROP_PREFIX = "x-forwarded-"


# Distinct header names whose verdict is remembered (clients send few; a hostile one
# sending many new names only makes its own requests take the slower path).
_VERDICTS_LIMIT = 1024


class HeaderPolicy:
    """Which request headers go upstream, computed once from settings."""

    def __init__(self, settings: Settings) -> None:
        self.drop = HOP_BY_HOP | CONTROL_HEADERS | {settings.session.header.lower()}
        self._drop_inspect = self.drop | {"accept-encoding"}
        key = settings.upstream.api_key.get_secret_value()
        self.authorization = f"Bearer {key}" if key else None
        self._auth_value = None if not key else f"Bearer {key}".encode("latin-1")
        allowed = {name.strip().lower() for name in settings.upstream.forward_client_headers}
        self._lent = bool(key)
        self._lent_allowed = frozenset(allowed)
        # Per raw header name: (forwarded as is, forwarded when not inspecting).
        self._verdicts: dict[bytes, tuple[bool, bool]] = {}

    def _verdict(self, name: bytes) -> tuple[bool, bool]:
        verdict = self._verdicts.get(name)
        if verdict is None:
            lowered = name.decode("latin-1").lower()
            own = lowered.startswith(_CONTROL_PREFIX)
            replaced = self.authorization is not None and lowered == "authorization"
            keep = not (own or replaced or self._withheld(lowered))
            verdict = (
                keep and lowered not in self._drop_inspect,
                keep and lowered not in self.drop,
            )
            if len(self._verdicts) < _VERDICTS_LIMIT:
                self._verdicts[name] = verdict
        return verdict

    def _withheld(self, lowered: str) -> bool:
        """A caller's own credential or origin header, kept off the proxy's lent key."""
        return (
            self._lent
            and (lowered in LENT_KEY_DROP or lowered.startswith(_LENT_KEY_DROP_PREFIX))
            and lowered not in self._lent_allowed
        )

    def outgoing(
        self, headers: Iterable[tuple[bytes, bytes]], *, inspect: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Headers for the upstream. ``inspect``: the proxy reads the answer (overflow
        errors, usage), so it is asked for uncompressed bytes."""
        return self._outgoing(headers, inspect, None)

    def outgoing_and_auth(
        self, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
        """``outgoing(headers, inspect=True)`` and ``auth_only`` of it, in one pass."""
        auth: list[tuple[bytes, bytes]] = []
        return self._outgoing(headers, True, auth), auth

    def _outgoing(
        self,
        headers: Iterable[tuple[bytes, bytes]],
        inspect: bool,
        auth: list[tuple[bytes, bytes]] | None,
    ) -> list[tuple[bytes, bytes]]:
        """``outgoing``; with ``auth``, the headers of it ``auth_only`` keeps go there too."""
        which = 0 if inspect else 1
        verdicts, verdict = self._verdicts, self._verdict
        out = []
        options = None
        for k, v in headers:
            if (verdicts.get(k) or verdict(k))[which]:  # the name seen before: no call
                out.append((k, v))
                if auth is not None and k.lower() in AUTH_HEADERS:
                    auth.append((k, v))
            elif len(k) == 10 and k.lower() == b"connection":
                options = v if options is None else options + b"," + v
        if options is not None:
            out = _this_hop_dropped(options, out, auth)
        if inspect:
            out.append((b"accept-encoding", b"identity"))
        if self._auth_value is not None:
            out.append((b"authorization", self._auth_value))
            if auth is not None:
                auth.append((b"authorization", self._auth_value))
        return out

    @staticmethod
    def auth_only(outgoing: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in outgoing if k.lower() in AUTH_HEADERS]


def _this_hop_dropped(
    options: bytes, out: list[tuple[bytes, bytes]], auth: list[tuple[bytes, bytes]] | None
) -> list[tuple[bytes, bytes]]:
    """``out`` without the headers the client's Connection header (``options``) names,
    which RFC 9110 7.6.1 says are for this hop only; ``auth`` loses them too."""
    named = {t.strip().lower() for t in options.decode("latin-1").split(",")}
    if auth:
        auth[:] = [(k, v) for k, v in auth if k.decode("latin-1").lower() not in named]
    return [(k, v) for k, v in out if k.decode("latin-1").lower() not in named]


def response_headers(response: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    drop = _RESPONSE_DROP
    out = []
    options = None
    for k, v in response.raw_headers:
        lowered = k.lower()
        if lowered not in drop:
            out.append((k, v))
        elif lowered == b"connection":
            options = v if options is None else options + b"," + v
    if options is not None:
        # RFC 9110 7.6.1, as for requests: what the upstream's Connection header names
        # was for the proxy's hop only, never the client's.
        named = {t.strip().lower() for t in options.split(b",")}
        out = [(k, v) for k, v in out if k.lower() not in named]
    return out
