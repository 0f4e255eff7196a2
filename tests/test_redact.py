"""Issue 23 item 5: a URL is shown without its password or secret query values."""

from __future__ import annotations

import pytest

from proxy.config import Settings
from proxy.redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@10.0.0.1:6379/0", "redis://:***@10.0.0.1:6379/0"),
        ("rediss://app:hunter2@redis.internal/0", "rediss://app:***@redis.internal/0"),
        # A password with "/", "?", "@" or "#" in it, not percent-encoded.
        ("redis://app:hun/ter?2@x#y@h:1/0", "redis://app:***@h:1/0"),
        ("redis://hunter2@h/0", "redis://***@h/0"),
        (
            "redis+sentinel://:hunter2@s1:26379,s2:26379/mymaster/0?sentinel_password=hunter3",
            "redis+sentinel://:***@s1:26379,s2:26379/mymaster/0?sentinel_password=***",
        ),
        (
            "unix:///run/redis.sock?db=1&password=hunter2&client_name=cp",
            "unix:///run/redis.sock?db=1&password=***&client_name=cp",
        ),
        (
            "https://llm.example/v1?api-key=hunter2&api-version=2024-10-21&sig=hunter3",
            "https://llm.example/v1?api-key=***&api-version=2024-10-21&sig=***",
        ),
        ("redsi://:hunter2@h", "redsi://:***@h"),  # a mistyped scheme too
        ("redis:/:hunter2@h", "redis:***@h"),
        ("redis://10.0.0.1:6379/0?token=", "redis://10.0.0.1:6379/0?token="),
        ("memory://", "memory://"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_a_url_is_shown_without_its_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "hunter" not in redact_url(url)


def test_settings_repr_leaves_the_store_url_out() -> None:
    """Settings printed whole (a debugging print, an exception's locals) show no password."""
    settings = Settings(store={"url": "redis://:hunter2@h:6379/0"})
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings)


def test_learned_window_keys_hold_no_secret_of_the_upstream_url() -> None:
    """Windows learned from an upstream are stored under its URL: not under its key."""
    from proxy.upstream.windows import WindowPolicy

    settings = Settings(upstream={"base_url": "https://u:hunter2@llm.example/v1?key=hunter3"})
    policy = WindowPolicy.from_settings(settings)
    assert policy.upstream == "https://u:***@llm.example/v1?key=***"
    plain = Settings(upstream={"base_url": "http://127.0.0.1:8000/v1"})
    assert WindowPolicy.from_settings(plain).upstream == "http://127.0.0.1:8000/v1"  # as before
