"""``redis+sentinel://`` store URLs (proxy/store/sentinel.py): what each part becomes, and
refusals that never repeat a password. The store itself on real sentinels:
tests/e2e/test_topologies.py and the store contract."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config import Settings
from proxy.config_file import describe_invalid
from proxy.store.sentinel import is_sentinel_url, parse_sentinel_url


def test_the_hosts_are_the_sentinels_and_the_path_names_the_service_and_db() -> None:
    url = parse_sentinel_url("redis+sentinel://s1:26380,s2,[::1]:26381/mymaster/2")
    assert url.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert url.service == "mymaster"
    assert url.node["db"] == 2
    assert not url.tls
    assert parse_sentinel_url("redis+sentinel://s1/mymaster").node["db"] == 0


def test_the_userinfo_is_the_data_nodes_auth_and_the_options_the_sentinels() -> None:
    url = parse_sentinel_url(
        "redis+sentinel://app:p%40ss@s1:26379/svc"
        "?sentinel_username=watcher&sentinel_password=s%26cret"
    )
    assert (url.node["username"], url.node["password"]) == ("app", "p@ss")
    assert url.sentinel == {"username": "watcher", "password": "s&cret"}
    # Either may go without the other.
    alone = parse_sentinel_url("redis+sentinel://:only-data@s1/svc")
    assert alone.node["password"] == "only-data"
    assert alone.sentinel == {}


def test_tls_covers_the_sentinels_and_the_data_nodes() -> None:
    url = parse_sentinel_url("rediss+sentinel://s1:26379/svc?ssl_ca_certs=/etc/ca.pem")
    assert url.tls
    assert url.sentinel == {"ssl": True, "ssl_ca_certs": "/etc/ca.pem"}
    assert url.node["ssl_ca_certs"] == "/etc/ca.pem"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:hunter2@s1:26379",
        "redis+sentinel://:hunter2@s1:26379/",
        "redis+sentinel://:hunter2@s1:26379/svc/zero",
        "redis+sentinel://:hunter2@s1:26379/svc/0/extra",
        "redis+sentinel://:hunter2@/svc",
        "redis+sentinel://:hunter2@s1,,s2/svc",
        "redis+sentinel://s1/svc?password=hunter2",
        "redis+sentinel://s1/svc?sentinel_passwd=hunter2",
    ],
)
def test_a_malformed_url_is_refused_without_its_secrets(url: str) -> None:
    with pytest.raises(ValueError, match="Sentinel URL") as refused:
        parse_sentinel_url(url)
    assert "hunter2" not in str(refused.value)


def test_only_the_sentinel_schemes_are_sentinel_urls() -> None:
    assert is_sentinel_url("redis+sentinel://s/svc")
    assert is_sentinel_url("REDISS+SENTINEL://s/svc")
    assert not is_sentinel_url("redis://s:6379/0")
    assert not is_sentinel_url("redis-sentinel://s/svc")


@pytest.mark.parametrize("url", ["redis+sentinel://s1:26379/svc", "rediss+sentinel://s1/svc/1"])
def test_the_settings_take_sentinel_urls(url: str) -> None:
    assert Settings(store={"url": url}).store.url == url


@pytest.mark.parametrize("url", ["redis-sentinel://:hunter2@s1/svc", "sentinel://:hunter2@s1"])
def test_the_settings_refuse_other_schemes_without_echoing_the_url(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(store={"url": url})
    message = describe_invalid(refused.value)
    assert "unsupported store url" in message
    assert "redis[s]+sentinel" in message  # what to write instead
    assert "hunter2" not in message
