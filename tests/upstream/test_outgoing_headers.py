"""``HeaderPolicy.outgoing_and_auth``: in one pass, what ``outgoing(inspect=True)`` and
``auth_only`` of it give (the pipeline's headers upstream and its summarizer's)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from proxy.config import Settings
from proxy.upstream.headers import HeaderPolicy

_HEADERS = [
    [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-client")],
    [(b"Authorization", b"Bearer a"), (b"api-key", b"k"), (b"x-api-key", b"x")],
    [(b"openai-organization", b"org"), (b"OpenAI-Project", b"p"), (b"anthropic-version", b"1")],
    [(b"connection", b"keep-alive, x-api-key"), (b"x-api-key", b"gone"), (b"api-key", b"k")],
    [(b"Connection", b"Authorization"), (b"authorization", b"Bearer named")],
    [(b"x-session-id", b"s"), (b"x-compaction", b"off"), (b"x-compaction-purpose", b"p")],
    [(b"accept-encoding", b"br"), (b"host", b"h"), (b"x-forwarded-for", b"1.2.3.4")],
    [],
]
_SETTINGS: list[dict[str, Any]] = [
    {"upstream": {"base_url": "http://u/v1"}},
    {"upstream": {"base_url": "http://u/v1", "api_key": "sk-lent"}},
    {
        "upstream": {
            "base_url": "http://u/v1",
            "api_key": "sk-lent",
            "forward_client_headers": ["api-key", "OpenAI-Organization"],
        }
    },
]


@pytest.mark.parametrize(("headers", "settings"), list(itertools.product(_HEADERS, _SETTINGS)))
def test_one_pass_gives_outgoing_and_its_auth_headers(
    headers: list[tuple[bytes, bytes]], settings: dict[str, Any]
) -> None:
    policy = HeaderPolicy(Settings(**settings))
    expected = policy.outgoing(headers, inspect=True)
    assert policy.outgoing_and_auth(headers) == (expected, policy.auth_only(expected))
    # and again, the verdicts remembered
    assert policy.outgoing_and_auth(headers) == (expected, policy.auth_only(expected))
