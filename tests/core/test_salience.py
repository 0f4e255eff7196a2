"""Issue 21 (the 1.5B agent bench, 0/10): a bounded list of values keeps the settings a
tool returned before the fields its later logs repeat. Each list that keeps values is
checked on the bench's shape: five config reads (two ``KEY = VALUE`` settings each),
then build logs whose lines carry ``pid=…`` and ``key=session:…``, newest last."""

from __future__ import annotations

from proxy.core.identifiers import restore_identifiers
from proxy.core.omitted import elided_values, omitted_recap
from proxy.core.salience import keep_order, tiers
from proxy.core.values import find_values
from proxy.core.wording import CARRIED_HEADING

SETTINGS = [
    ("SERVER_PORT", "7939"),
    ("DB_HOST", "db-gateway-5.internal"),
    ("QUEUE_NAME", "ledger-jobs"),
    ("LOG_LEVEL", "WARN"),
    ("BUCKET", "s3-archive-17"),
    ("RETRY_LIMIT", "7"),
    ("FEATURE_FLAG", "beta-checkout"),
    ("CACHE_TTL_SECONDS", "900"),
    ("API_VERSION", "v3.2"),
    ("MAX_WORKERS", "12"),
]


def _config(step: int) -> str:
    pairs = SETTINGS[2 * step : 2 * step + 2]
    return f"# config/service-{step}.env\n" + "".join(f"{k} = {v}\n" for k, v in pairs)


def _log(step: int) -> str:
    lines = [
        f"INFO worker pid={1000 + 37 * step + i} started key=session:{4000 + 91 * step + i}"
        for i in range(4)
    ]
    return "\n".join([*lines, f"INFO build {step} finished in 5518 ms"])


def _sources() -> list[tuple[str, str]]:
    sources = [("tool", _config(step)) for step in range(5)]
    return sources + [("tool", _log(step)) for step in range(12)]


def test_restored_identifiers_keep_every_setting_before_log_fields() -> None:
    result = restore_identifiers("## Summary\nThe configs were read.", _sources(), 600)
    assert result.dropped > 0  # the section is full: something had to go
    section = result.summary.split(CARRIED_HEADING, 1)[1]
    for key, value in SETTINGS:
        assert f"`{key} = {value}`" in section
    assert "pid=1000`" not in section  # the oldest of a log's repeated field went first


def test_a_trimmed_views_digest_keeps_every_setting_before_log_fields() -> None:
    messages = [{"role": role, "content": text, "tool_call_id": "c"} for role, text in _sources()]
    digest = omitted_recap(messages, [b""] * len(messages), "", 900, 64)
    for key, value in SETTINGS:
        assert f"{key} = {value}" in digest
    assert "pid=1000`" not in digest
    assert digest.index("SERVER_PORT") < digest.index("MAX_WORKERS")  # read order kept


def test_an_elided_outputs_placeholder_keeps_its_settings_before_log_fields() -> None:
    text = _log(0) + "\n" + _log(1) + "\nSERVER_PORT = 7939\nDB_HOST = db-gateway-5.internal\n"
    placeholder = elided_values({"role": "tool", "content": text, "tool_call_id": "c"}, b"")
    assert "`SERVER_PORT = 7939`" in placeholder
    assert "`DB_HOST = db-gateway-5.internal`" in placeholder
    # Reading order is kept among what was chosen.
    assert placeholder.index("SERVER_PORT") < placeholder.index("DB_HOST")


def test_tiers_settings_labels_other_values_and_repeated_fields() -> None:
    text = (
        "color=teal then the port is 8443, PORT=8080 and call_8f3a2c; "
        "pid=11 pid=12 pid=13 SERVER_PORT = 7781"
    )
    found = find_values(text)
    ranks = dict(zip([v.key for v in found], tiers(found), strict=True))
    assert ranks["color=teal"] == 1  # a bare lower-case pair: no setting by its name
    assert ranks["8443"] == 0  # labelled in prose
    assert ranks["PORT=8080"] == 0
    assert ranks["call_8f3a2c"] == 1
    assert ranks["pid=11"] == ranks["pid=12"] == 2  # a log's field, seen three times
    assert ranks["pid=13"] == 1  # its newest value keeps its own tier
    assert ranks["SERVER_PORT=7781"] == 0
    builds = find_values("Run build 10. Run build 11. Run build 12.")
    assert tiers(builds) == [2, 2, 0]  # a label every request repeats: only the newest


def test_keep_order_is_by_tier_then_newest_first() -> None:
    assert keep_order([1, 0, 2, 0, 1]) == [3, 1, 4, 0, 2]
