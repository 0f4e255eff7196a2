"""Secrets out of URLs before they are shown: ``redact_url``.

A store URL may carry a password in its userinfo (``redis://user:secret@host``,
``redis://:secret@host``) or in its query (``?password=...``,
``sentinel_password=...``), and an upstream base URL a key in its query. Whatever
shows one (``check-config``, a configuration error, a log line) shows
``redact_url(url)``: the username stays, the password becomes ``***``, and so does
the value of every query parameter whose name contains one of ``SECRET_PARAMS``
(case-insensitive: ``password``, ``sentinel_password``, ``token``, ``key``,
``api-key``, ``secret``, ``auth``, ``sig``...).
"""

from __future__ import annotations

# Substrings of a query parameter's name that make its value a secret.
SECRET_PARAMS = ("pass", "secret", "token", "key", "auth", "credential", "sig")
MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    # The userinfo ends at the last "@": a password may hold "/", "?" or "#" unencoded.
    # An "@" in a query value makes it take the host along: more hidden, never less.
    userinfo, at, rest = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        plain_user = colon and not any(c in user for c in "/?#")
        userinfo = f"{user}:{MASK}" if plain_user else MASK
    path, mark, query = rest.partition("?")
    if mark:
        query = "&".join(_redact_param(pair) for pair in query.split("&"))
    return f"{scheme}{sep}{userinfo}{at}{path}{mark}{query}"


def _redact_param(pair: str) -> str:
    name, eq, value = pair.partition("=")
    if eq and value and any(part in name.lower() for part in SECRET_PARAMS):
        return f"{name}={MASK}"
    return pair
