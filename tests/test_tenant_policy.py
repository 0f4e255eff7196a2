"""Per-tenant policy (issue 26 item 3): the ``tenants:`` entries validated and matched,
each resolved once into its effective compaction settings (proxy/tenants.py); the caps'
counts (compaction/caps.py); a reload of the config file (serve/reload.py). End to end
under uvicorn: tests/e2e/test_tenant_policy_e2e.py."""

from __future__ import annotations

import io
import logging
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from proxy.__main__ import main
from proxy.compaction.caps import TenantCapped, TenantCaps
from proxy.config import Settings, load_settings
from proxy.core.outcome import Turn
from proxy.core.session import tenant_from_headers
from proxy.errors import ConfigError, StoreError
from proxy.observe.metrics import Metrics
from proxy.observe.metrics.tenants import TenantSeries
from proxy.pipeline import compacted_view
from proxy.serve.reload import Reloader
from proxy.services import Services
from proxy.store import build_store
from proxy.store.quota import MemoryQuota, RedisQuota, build_quota
from proxy.tenants import PolicyTable
from tests.support.fakes import (
    WINDOW,
    FakeClock,
    FakeUpstream,
    conversation,
    fake_settings,
    make_services,
    turn_of,
)
from tests.support.servers import RedisServer, proxy_settings

A = tenant_from_headers({"authorization": "Bearer sk-a"})
B = tenant_from_headers({"authorization": "Bearer sk-b"})
C = tenant_from_headers({"authorization": "Bearer sk-c"})


def settings(*tenants: dict[str, Any], **compaction: Any) -> Settings:
    return Settings(tenants=list(tenants), compaction=compaction)


def invalid(*tenants: dict[str, Any], **compaction: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        settings(*tenants, **compaction)
    return str(caught.value)


# -- matching -------------------------------------------------------------------------


def test_an_entry_matches_by_the_id_the_admin_api_shows_or_the_whole_id() -> None:
    table = settings({"id": A[:12], "mode": "off"}, {"id": B, "mode": "shadow"}).tenants
    policies = PolicyTable.build(table, Settings().compaction)
    a, b = policies.policy_for(A), policies.policy_for(B)
    assert a is not None
    assert a.compaction.effective_mode == "off"
    assert b is not None
    assert b.compaction.effective_mode == "shadow"
    assert policies.policy_for(C) is None  # no entry: the default
    # A whole id matches that tenant only, even one sharing its first 12 digits.
    assert policies.policy_for(B[:12] + "0" * 20) is None


def test_a_label_names_a_group_of_ids_and_anonymous_is_an_id() -> None:
    entry = {"label": "batch-agents", "ids": [A[:12], B], "trigger_ratio": 0.6}
    s = settings(entry, {"id": "anonymous", "enabled": False})
    policies = PolicyTable.build(s.tenants, s.compaction)
    for tenant in (A, B):
        found = policies.policy_for(tenant)
        assert found is not None
        assert found.name == "batch-agents"
        assert found.compaction.trigger_ratio == 0.6
    anonymous = policies.policy_for("anonymous")
    assert anonymous is not None
    assert anonymous.compaction.effective_mode == "off"
    assert policies.policy_for(C) is None


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"mode": "off"}, "by id or by label"),
        ({"id": A, "label": "x", "ids": [B]}, "by id or by label"),
        ({"label": "team"}, "lists no ids"),
        ({"id": A, "ids": [B]}, "ids go with a label"),
        ({"id": "sk-live-raw-api-key"}, "should match pattern"),
        ({"label": "team", "ids": ["Bearer sk-a"]}, "should match pattern"),
        ({"label": "x" * 65, "ids": [A]}, "at most 64"),
        ({"id": A, "enabled": False, "mode": "on"}, "contradicts"),
        ({"id": A, "trigger_ratio": 1.5}, "less than or equal to 1"),
        ({"id": A, "summaries_per_hour": -1}, "greater than or equal to 0"),
        ({"id": A, "summarizer_model": "m" * 257}, "at most 256"),
        ({"id": A, "colour": "blue"}, "Extra inputs"),
        ({"id": A, "trigger_ratio": 0.4}, "tenants[0] (" + A + "): target_ratio must be below"),
    ],
)
def test_entries_are_validated(entry: dict[str, Any], says: str) -> None:
    assert says in invalid(entry)


def test_an_id_named_twice_and_too_many_entries_are_refused() -> None:
    assert "named twice" in invalid({"id": A, "mode": "off"}, {"label": "g", "ids": [A[:12]]})
    many = [{"id": f"{i:012x}"} for i in range(1001)]
    assert "at most 1000" in invalid(*many)


def test_a_bad_entry_in_the_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"tenants": [{"id": A, "trigger_ratio": 0.3}]}))
    with pytest.raises(ConfigError, match=r"tenants\[0\]"):
        load_settings(path)


# -- effective settings, resolved once ------------------------------------------------


def test_an_entry_overrides_what_it_sets_and_follows_compaction_for_the_rest() -> None:
    base = {"summary_max_tokens": 900, "summarizer_model": "big", "trigger_ratio": 0.8}
    entry = {"id": A, "trigger_ratio": 0.4, "target_ratio": 0.2, "summary_max_tokens": 300}
    s = settings(entry, {"id": B, "summarizer_model": "small", "precompact": False}, **base)
    policies = PolicyTable.build(s.tenants, s.compaction)
    a, b = policies.policy_for(A), policies.policy_for(B)
    assert a is not None
    assert b is not None
    assert (a.compaction.trigger_ratio, a.compaction.target_ratio) == (0.4, 0.2)
    assert (a.compaction.summary_max_tokens, a.compaction.summarizer_model) == (300, "big")
    assert a.compaction.precompact.ratio == pytest.approx(0.3)  # 0.6 of 0.8, so of 0.4
    assert (b.compaction.summarizer_model, b.compaction.precompact.ratio) == ("small", None)
    assert b.compaction.summary_max_tokens == 900
    # Resolved once: every lookup hands out the same object.
    assert policies.policy_for(A) is a


def test_an_entry_switches_compaction_on_off_or_to_shadow() -> None:
    s = settings(
        {"id": A, "enabled": True}, {"id": B, "mode": "shadow"}, {"id": C, "enabled": False}
    )
    policies = PolicyTable.build(s.tenants, s.compaction.model_copy(update={"mode": "off"}))
    modes = [p.compaction.effective_mode for p in map(policies.policy_for, (A, B, C)) if p]
    assert modes == ["on", "shadow", "off"]


# -- caps -----------------------------------------------------------------------------


class BrokenQuota:
    async def add(self, name: str, amount: int, ttl_s: float) -> int:
        raise StoreError("redis quota failed: ConnectionError")


async def _capped(
    entry: dict[str, object],
) -> tuple[FakeClock, Services, TenantCaps, Turn]:
    """Services whose only ``tenants`` entry is tenant A's ``entry``, its caps, and a
    turn of A's."""
    clock = FakeClock()
    s = fake_settings()
    s = Settings(**{**s.model_dump(), "tenants": [{"id": A, **entry}]})
    services = make_services(s, FakeUpstream(), clock)
    caps = services.compactor.caps
    assert caps is not None
    turn = await turn_of(services, [{"role": "user", "content": "hi"}])
    turn = replace(turn, tenant=A, policy=services.policies.policy_for(A))
    return clock, services, caps, turn


async def test_summaries_per_hour_caps_per_clock_hour() -> None:
    clock, services, caps, turn = await _capped({"summaries_per_hour": 1})
    assert await caps.admit(turn) is None
    assert await caps.admit(turn) == "summaries_per_hour"
    with pytest.raises(TenantCapped):
        await caps.admit(turn, background=True)
    capped = services.metrics.tenants.capped.labels(reason="summaries_per_hour")
    assert capped._value.get() == 2
    clock.advance(3600)
    assert await caps.admit(turn) is None  # the next hour


async def test_summarizer_tokens_per_day_caps_what_summaries_spent() -> None:
    clock, _, caps, turn = await _capped({"summarizer_tokens_per_day": 500})
    assert await caps.admit(turn) is None
    await caps.spend(turn, 499)
    assert await caps.admit(turn) is None
    await caps.spend(turn, 1)
    assert await caps.admit(turn) == "summarizer_tokens_per_day"
    clock.advance(86400)
    assert await caps.admit(turn) is None


async def test_a_store_that_fails_is_counted_and_never_caps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    series = TenantSeries(CollectorRegistry())
    caps = TenantCaps(BrokenQuota(), series)
    s = fake_settings()
    s = Settings(**{**s.model_dump(), "tenants": [{"id": A, "summaries_per_hour": 0}]})
    services = make_services(s, FakeUpstream(), FakeClock())
    turn = await turn_of(services, [{"role": "user", "content": "hi"}])
    turn = replace(turn, tenant=A, policy=services.policies.policy_for(A))
    assert await caps.admit(turn) is None
    await caps.spend(turn, 10)  # no cap on tokens: nothing to count
    assert series.cap_errors._value.get() == 1


async def test_memory_counters_expire() -> None:
    clock = FakeClock()
    quota = MemoryQuota(clock)
    assert await quota.add("x", 2, 10) == 2
    assert await quota.add("x", 0, 10) == 2
    clock.advance(10)
    assert await quota.add("x", 0, 10) == 0


# -- reload ---------------------------------------------------------------------------


def _write(path: Path, tenants: Any, **extra: Any) -> None:
    path.write_text(yaml.safe_dump({"tenants": tenants, **extra}))


async def test_a_reload_applies_tenants_and_a_bad_one_keeps_the_old_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    _write(path, [{"id": A, "mode": "off"}])
    services = make_services(load_settings(path), FakeUpstream(), FakeClock())
    reloader = Reloader(services, path)
    reloads = services.metrics.tenants.reloads

    def mode() -> str | None:
        found = services.policies.policy_for(A)
        return None if found is None else found.compaction.effective_mode

    assert (await reloader.reload("test"), mode()) == ("unchanged", "off")
    _write(path, [{"id": A, "mode": "shadow"}])
    assert (await reloader.reload("test"), mode()) == ("applied", "shadow")
    caplog.set_level(logging.WARNING, logger="proxy.reload")
    # Bad YAML on a line holding a secret: the log says where, never what.
    path.write_text(f"tenants:\n  - id: {A}\n    mode: off\n  bad: [sk-secret-value\n")
    assert (await reloader.reload("test"), mode()) == ("invalid", "shadow")
    _write(path, [{"id": A, "trigger_ratio": 0.2}])  # target_ratio 0.5 is not below it
    assert (await reloader.reload("test"), mode()) == ("invalid", "shadow")
    _write(path, [{"id": A, "mode": "off"}], upstream={"api_key": "sk-not-logged"})
    assert (await reloader.reload("test"), mode()) == ("applied", "off")
    assert [reloads.labels(outcome=o)._value.get() for o in ("applied", "invalid")] == [2, 2]
    text = caplog.text
    assert "rejected" in text
    assert "line" in text
    assert "tenants[0]" in text
    assert "only tenants applied" in text  # the api_key change waits for a restart
    assert "sk-secret-value" not in text
    assert "sk-not-logged" not in text


@pytest.mark.parametrize(
    "text", ["", "# being rewritten\n", "server: {reload_poll_s: 1}\n"], ids=repr
)
async def test_a_file_without_tenants_keeps_the_entries_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    """An empty, comment-only or tenants-less file (a truncate-then-write caught between
    the two) is refused while entries are in force; ``tenants: []`` still clears them."""
    path = tmp_path / "config.yaml"
    _write(path, [{"id": A, "mode": "off", "summaries_per_hour": 0}])
    services = make_services(load_settings(path), FakeUpstream(), FakeClock())
    reloader = Reloader(services, path)
    caplog.set_level(logging.WARNING, logger="proxy.reload")
    path.write_text(text)
    assert await reloader.reload("test") == "invalid"
    kept = services.policies.policy_for(A)
    assert kept is not None
    assert (kept.compaction.effective_mode, kept.capped) == ("off", True)
    assert services.metrics.tenants.reloads.labels(outcome="invalid")._value.get() == 1
    assert "sets no tenants" in caplog.text
    _write(path, [])
    assert await reloader.reload("test") == "applied"
    assert services.policies.policy_for(A) is None
    path.write_text(text)  # nothing in force: nothing to keep
    assert await reloader.reload("test") == "unchanged"


async def test_a_file_caught_mid_write_applies_only_once_it_has_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut that is still valid YAML (the writer has written entry 1 of 3) is not
    applied: the file is read again after a pause, and the writer finishing during it
    (here, in the pause itself: no timing involved) makes the reload read the whole file."""
    from proxy.serve import reload as reloading

    path = tmp_path / "config.yaml"
    _write(path, [{"id": A, "mode": "off"}])
    services = make_services(load_settings(path), FakeUpstream(), FakeClock())
    reloader = Reloader(services, path)
    whole = [{"id": t, "mode": "shadow"} for t in (A, B, C)]
    full = yaml.safe_dump({"tenants": whole})
    path.write_text(full[: full.index("- id", 10)])  # ends after the first entry
    assert [e.get("id") for e in load_settings(path).model_dump()["tenants"]] == [A]
    writes = [full]
    pause = lambda _: writes and path.write_text(writes.pop())  # noqa: E731
    monkeypatch.setattr(reloading, "_pause", pause, raising=False)
    assert await reloader.reload("test") == "applied"
    assert len(services.policies.table.entries) == 3
    # A file still changing after every pause is not read at all; the next poll retries.
    growing = lambda _: path.write_text(path.read_text() + "#\n")  # noqa: E731
    monkeypatch.setattr(reloading, "_pause", growing, raising=False)
    assert await reloader.reload("test") == "invalid"
    assert len(services.policies.table.entries) == 3


async def test_a_file_without_tenants_is_refused_once_in_the_log_per_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleting tenants: on purpose is refused (a restart applies it): the warning says
    how to clear them, once per version of the file, not on every SIGHUP."""
    path = tmp_path / "config.yaml"
    _write(path, [{"id": A, "mode": "off"}])
    services = make_services(load_settings(path), FakeUpstream(), FakeClock())
    reloader = Reloader(services, path)
    caplog.set_level(logging.WARNING, logger="proxy.reload")
    path.write_text("server: {reload_poll_s: 1}\n")
    assert [await reloader.reload("SIGHUP") for _ in range(3)] == ["invalid"] * 3
    assert services.metrics.tenants.reloads.labels(outcome="invalid")._value.get() == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "proxy.reload"]
    assert len(warnings) == 1
    assert "write `tenants: []`" in warnings[0]
    path.write_text("server: {reload_poll_s: 2}\n")  # another version: said again
    assert await reloader.reload("file change") == "invalid"
    assert len([r for r in caplog.records if r.name == "proxy.reload"]) == 2


async def test_a_file_that_breaks_the_reader_is_invalid_and_the_next_good_one_applies(
    tmp_path: Path,
) -> None:
    """YAML nested 3,000 deep makes the loader raise RecursionError, not a ConfigError: it
    must count as invalid, not end the watch (found in review)."""
    path = tmp_path / "config.yaml"
    _write(path, [{"id": A, "mode": "off"}])
    services = make_services(load_settings(path), FakeUpstream(), FakeClock())
    reloader = Reloader(services, path)
    path.write_text("tenants: " + "[" * 3000 + "]" * 3000 + "\n")
    assert await reloader.reload("test") == "invalid"
    _write(path, [{"id": A, "mode": "shadow"}])
    assert await reloader.reload("test") == "applied"


async def _two_replicas_at_their_summary_cap(
    s: Settings, stores: list[Any]
) -> tuple[TenantCaps, TenantCaps, TenantSeries, Turn]:
    """Two replicas' caps on ``stores`` (Redis counters): A's two summaries an hour taken,
    one on each, the third refused on either, and A's 100 tokens a day spent on the second."""
    quotas = [build_quota(s, store) for store in stores]
    assert all(isinstance(q, RedisQuota) for q in quotas)
    series = TenantSeries(CollectorRegistry())
    one, two = (TenantCaps(q, series) for q in quotas)
    services = make_services(s, FakeUpstream(), FakeClock())
    turn = await turn_of(services, [{"role": "user", "content": "hi"}])
    turn = replace(turn, tenant=A, policy=services.policies.policy_for(A))
    assert await one.admit(turn) is None
    assert await two.admit(turn) is None
    assert await one.admit(turn) == "summaries_per_hour"  # the third, on either
    await two.spend(turn, 100)
    return one, two, series, turn


@pytest.mark.redis
async def test_redis_counts_a_tenants_caps_once_for_every_replica(
    redis_server: RedisServer,
) -> None:
    """Two replicas (two stores on one Redis) count against one total; a store that goes
    away is counted and caps nothing."""
    tenants = [{"id": A, "summaries_per_hour": 2, "summarizer_tokens_per_day": 100}]
    s = proxy_settings("http://127.0.0.1:1", store={"url": redis_server.url}, tenants=tenants)
    stores = [build_store(s, Metrics.create()) for _ in range(2)]
    try:
        one, two, series, turn = await _two_replicas_at_their_summary_cap(s, stores)
        assert await two.admit(turn) == "summarizer_tokens_per_day"  # checked first
        redis_server.stop()
        assert await one.admit(turn) is None
        assert series.cap_errors._value.get() == 1
    finally:
        for store in stores:
            await store.aclose()


@pytest.mark.redis
async def test_a_stalled_redis_is_not_waited_on_by_caps_while_the_store_cools_down(
    redis_server: RedisServer,
) -> None:
    """Once the store has met the stall and is in its cool-down, a cap is counted as an
    error at once (the summary goes ahead), not after its own Redis timeouts."""
    tenants = [{"id": A, "summaries_per_hour": 2, "summarizer_tokens_per_day": 100}]
    s = proxy_settings("http://127.0.0.1:1", store={"url": redis_server.url}, tenants=tenants)
    store = build_store(s, Metrics.create())
    series = TenantSeries(CollectorRegistry())
    caps = TenantCaps(build_quota(s, store), series)
    services = make_services(s, FakeUpstream(), FakeClock())
    turn = await turn_of(services, [{"role": "user", "content": "hi"}])
    turn = replace(turn, tenant=A, policy=services.policies.policy_for(A))
    assert await caps.admit(turn) is None  # Redis answers: counted there
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        await store.load_window("gpt-stall")  # times out: the store starts its cool-down
        assert store.degraded
        started = time.monotonic()
        assert await caps.admit(turn) is None
        await caps.spend(turn, 10)
        waited = time.monotonic() - started
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
        await store.aclose()
    assert series.cap_errors._value.get() == 2
    assert waited < 0.1, f"caps waited {waited:.3f} s on a Redis the store knew was stalled"


def test_the_cli_prints_a_keys_tenant_id_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-a\n"))
    assert main(["tenant-id"]) == 0
    assert capsys.readouterr().out == f"{A[:12]}\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["tenant-id"]) == 2


def test_precompact_true_turns_it_on_where_compaction_has_it_off() -> None:
    entry = {
        "label": "x",
        "ids": [B],
        "precompact": True,
        "trigger_ratio": 0.4,
        "target_ratio": 0.2,
    }
    s = settings({"id": A, "precompact": True}, entry, precompact_ratio=None)
    table = PolicyTable.build(s.tenants, s.compaction)
    a, b = table.policy_for(A), table.policy_for(B)
    assert a is not None
    assert b is not None
    assert a.compaction.precompact.ratio == 0.6  # the defaults': 0.6 of a trigger of 0.8
    assert b.compaction.precompact.ratio == 0.3  # the same share of its own trigger


async def test_over_a_cap_the_view_is_trimmed_to_the_trigger_not_summarized() -> None:
    """Trimmed as a summary would have compacted it: to fit the trigger; to fit the
    window when the newest message alone is past the trigger (never a 400)."""
    s = fake_settings()
    s = Settings(**{**s.model_dump(), "tenants": [{"id": A, "summaries_per_hour": 0}]})
    upstream = FakeUpstream()
    services = make_services(s, upstream, FakeClock())

    async def view(messages: list[Any]) -> Any:
        turn = await turn_of(services, messages)
        turn = replace(turn, tenant=A, policy=services.policies.policy_for(A))
        return (await compacted_view(services, turn))[0]

    outcome = await view(conversation(30))
    assert (outcome.status, outcome.degraded) == ("trimmed", "summaries_per_hour")
    assert outcome.tokens + 256 <= int(WINDOW * 0.8)  # the trigger, not the window
    assert outcome.window == WINDOW
    big = [*conversation(10), {"role": "user", "content": "x " * 5600}]
    outcome = await view(big)
    assert (outcome.status, outcome.degraded) == ("trimmed", "summaries_per_hour")
    assert int(WINDOW * 0.8) < outcome.tokens + 256 <= WINDOW
    assert upstream.summary_calls == []


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
async def test_a_tenants_caps_count_once_for_every_replica_on_a_cluster_and_behind_sentinels(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """The same one total as on one Redis (above), where the store is a 3-primary Cluster
    (the counter's two commands pipelined to its key's node) or a primary found through
    sentinels: two replicas' caps against one count."""
    group = request.getfixturevalue("redis_cluster" if kind == "cluster" else "sentinel_shared")
    tenants = [{"id": A, "summaries_per_hour": 2, "summarizer_tokens_per_day": 100}]
    store_settings = {"url": group.url, "prefix": f"caps-{kind}-{time.time_ns()}"}
    s = proxy_settings("http://127.0.0.1:1", store=store_settings, tenants=tenants)
    stores = [build_store(s, Metrics.create()) for _ in range(2)]
    try:
        one, _, series, turn = await _two_replicas_at_their_summary_cap(s, stores)
        assert await one.admit(turn) == "summarizer_tokens_per_day"  # checked first
        assert series.cap_errors._value.get() == 0
    finally:
        for store in stores:
            await store.aclose()


@pytest.mark.parametrize("legacy", [True, False])
def test_an_entry_naming_a_legacy_id_matches_while_migrating(
    caplog: pytest.LogCaptureFixture, legacy: bool
) -> None:
    """Under server.tenant_id_secret, A (sk-a's legacy id) is not sk-a's id any more: its
    entry still applies to sk-a while legacy ids are matched, with one warning naming the
    new id (never the legacy one), and to no one once they are not."""
    server = {"tenant_id_secret": "s" * 32, "legacy_tenant_ids": legacy}
    s = Settings(server=server, tenants=[{"label": "old", "ids": [A[:12]], "mode": "off"}])
    services = make_services(s, FakeUpstream(), FakeClock())
    caplog.set_level(logging.WARNING, logger="proxy.tenants")
    tenant = services.tenant_ids.of({"authorization": "Bearer sk-a"})
    assert tenant != A
    for _ in range(3):
        found = services.policies.policy_for(tenant)
        assert (found.name if found else None) == ("old" if legacy else None)
    assert services.policies.policy_for(services.tenant_ids.of({"x-api-key": "sk-b"})) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "proxy.tenants"]
    assert len(warnings) == int(legacy)  # once, not once a request
    for warning in warnings:
        assert warning.startswith("tenants entry (old) names a tenant by its legacy id")
        assert f"its id is now {tenant[:12]}:" in warning
    assert all(A[:12] not in w for w in warnings)


def test_an_entry_turns_the_recall_tool_on_or_off_for_its_tenants() -> None:
    s = settings({"id": A[:12], "recall_tool_rounds": 3}, {"id": B, "recall_tool_rounds": 0})
    policies = PolicyTable.build(s.tenants, settings(recall_tool_rounds=2).compaction)
    a, b = policies.policy_for(A), policies.policy_for(B)
    assert a is not None
    assert a.compaction.recall_tool_rounds == 3
    assert b is not None
    assert b.compaction.recall_tool_rounds == 0
