"""The Helm chart's values schema and its config, pure: the schema's config part is
generated from Settings, secrets stay out of it, and the values mirror
config.example.yaml; the alert rules are valid PromQL, one fires when the proxy is
down, and each has its section in docs/runbook.md, which names only series the proxy
exports. Linting, rendering and running the chart with helm:
tests/e2e/test_helm_e2e.py (and test_helm_chart_e2e.py, test_helm_ops_e2e.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser
import pytest
import yaml

from proxy.config import Settings
from proxy.observe.ledger import Ledger
from proxy.observe.metrics import Metrics
from tests.support.dashboard import referenced
from tests.support.docs import all_docs
from tests.support.helm import CHART, ROOT, RUNBOOK, _script, runbook_sections

# --- pure checks, fast tier ---------------------------------------------------------


def test_values_schema_config_part_is_generated_from_settings() -> None:
    """After changing a setting, run scripts/helm-schema (this fails until then)."""
    generator = _script("_helm_schema")
    text = generator.SCHEMA_FILE.read_text(encoding="utf-8")
    assert generator.render(json.loads(text)) == text


def test_schema_leaves_secrets_out_of_config() -> None:
    schema = _script("_helm_schema").config_schema()
    props = schema["properties"]
    assert "api_key" not in props["upstream"]["properties"]
    assert "admin_key" not in props["server"]["properties"]
    assert "tenant_id_secret" not in props["server"]["properties"]
    assert "encryption_keys" not in props["store"]["properties"]
    assert props["upstream"]["additionalProperties"] is False
    assert "$ref" not in json.dumps(schema)


def _leaf_keys(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node and prefix != "models":
        return set().union(*(_leaf_keys(v, f"{prefix}.{k}".lstrip(".")) for k, v in node.items()))
    return {prefix}


SECRET_KEYS = {
    "server.admin_key",
    "server.tenant_id_secret",
    "upstream.api_key",
    "store.encryption_keys",
}


def test_values_config_mirrors_config_example() -> None:
    """values.yaml's `config` has every key of config.example.yaml but the secrets."""
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    assert _leaf_keys(values) == _leaf_keys(example) - SECRET_KEYS
    secret_fields = {
        f"{section}.{name}"
        for section, field in Settings.model_fields.items()
        if field.annotation is not None and hasattr(field.annotation, "model_fields")
        for name, sub in field.annotation.model_fields.items()
        if "SecretStr" in str(sub.annotation)
    }
    assert secret_fields == SECRET_KEYS
    models = [(m["match"], m["context_window"]) for m in values["models"]]
    assert models == [(m["match"], m["context_window"]) for m in example["models"]]


RULES = yaml.safe_load((CHART / "rules" / "alerts.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("rule", RULES, ids=[r.get("alert") or r["record"] for r in RULES])
def test_each_alert_rule_is_valid_promql(rule: dict[str, Any]) -> None:
    """What the Prometheus Operator's admission webhook checks before taking the rule."""
    promql_parser.parse(rule["expr"])
    assert set(rule) <= {"alert", "record", "expr", "for", "summary"}
    assert ("alert" in rule) != ("record" in rule)


def test_the_promql_check_can_fail() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum(rate(compaction_proxy_responses_total[5m])")


ALERTS = [r for r in RULES if "alert" in r]


def _up_selector(node: Any) -> Any:
    """The ``up{...}`` selector an expression tests, directly or compared with a number."""
    if isinstance(node, promql_parser.BinaryExpr):
        node = node.lhs
    if isinstance(node, promql_parser.VectorSelector) and node.name == "up":
        return node
    return None


def test_an_alert_fires_when_no_replica_is_up_or_scraped() -> None:
    """absent(): no target at all (every pod gone, or the scrape lost them) is an alert
    too, which ``up == 0`` alone never says."""
    absent = [
        r
        for r in ALERTS
        if isinstance(call := promql_parser.parse(r["expr"]), promql_parser.Call)
        and call.func.name == "absent"
        and _up_selector(call.args[0]) is not None
    ]
    assert [r["alert"] for r in absent] == ["CompactionProxyDown"]
    one_down = [r for r in ALERTS if _up_selector(promql_parser.parse(r["expr"])) is not None]
    assert [r["alert"] for r in one_down] == ["CompactionProxyTargetDown"]
    for rule in absent + one_down:
        # The placeholder the PrometheusRule replaces with the targets' matchers.
        assert 'up{job="compaction-proxy"}' in rule["expr"]


@pytest.mark.parametrize("rule", ALERTS, ids=[r["alert"] for r in ALERTS])
def test_each_alert_has_a_runbook_section(rule: dict[str, Any]) -> None:
    """The rendered rule's runbook_url ends in #<name, lowercased>: that anchor is here,
    and says what to check and what to do."""
    sections = runbook_sections(RUNBOOK.read_text(encoding="utf-8"))
    body = sections[rule["alert"].lower()]
    assert "Check" in body
    assert "Act:" in body


def test_the_runbook_has_a_section_for_each_alert_and_no_other() -> None:
    sections = runbook_sections(RUNBOOK.read_text(encoding="utf-8"))
    alerts = {r["alert"].lower() for r in ALERTS}
    assert set(sections) - {"runbook-compaction-proxy-alerts"} == alerts
    # Its links between sections land.
    links = re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text(encoding="utf-8"))
    assert links
    assert set(links) <= set(sections)


def _declared() -> dict[str, set[str]]:
    """Every family the proxy declares (as services.py builds its registry), to the
    label names its series carry."""
    metrics = Metrics.create()
    Ledger(metrics.registry, [])
    # prometheus-client keeps a metric's label names only on the metric: series with
    # an open label set are not exported before their first value.
    collectors: list[Any] = list(metrics.registry._collector_to_names)
    return {c._name: set(c._labelnames) for c in collectors if hasattr(c, "_labelnames")}


# Labels the scrape adds, and the histogram's bucket label.
SCRAPE_LABELS = {"job", "instance", "namespace", "le"}


def test_the_runbook_and_the_rules_name_only_series_and_labels_the_proxy_exports() -> None:
    declared = _declared()
    text = RUNBOOK.read_text(encoding="utf-8")
    named = set(re.findall(r"\bcompaction_proxy_\w+", text))
    queries = [*re.findall(r"`([^`\n]+)`", text), *(r["expr"] for r in RULES)]
    checked = 0
    for query in queries:
        try:
            promql_parser.parse(query)
        except ValueError:
            continue  # not PromQL: a command, a value
        names = {n for n in referenced(query)[0] if re.fullmatch(r"compaction_proxy_\w+", n)}
        labels = referenced(query)[1]
        named |= names
        for name in names:
            family = re.sub(r"(_total|_bucket|_count|_sum)$", "", name)
            assert labels <= declared.get(family, set()) | SCRAPE_LABELS, (query, family)
            checked += 1
    assert checked > 20
    families = {re.sub(r"(_total|_bucket|_count|_sum)$", "", n) for n in named}
    assert families - set(declared) == set()
    # What the runbook names, the docs describe (README.md and docs/, the runbook aside).
    described = all_docs().replace(RUNBOOK.read_text(encoding="utf-8"), "")
    for family in families:
        assert family.removeprefix("compaction_proxy_") in described, family


def test_runbook_anchors_are_made_as_github_makes_them() -> None:
    assert "compactionproxydown" in runbook_sections("# T\n\n## CompactionProxyDown\n\nx\n")
    assert runbook_sections("## Compaction Proxy: Down!\n") == {"compaction-proxy-down": "\n"}
    assert runbook_sections("```bash\n# not a heading\n```\n") == {}
