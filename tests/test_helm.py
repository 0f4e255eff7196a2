"""The Helm chart's values schema and its config, pure: the schema's config part is
generated from Settings, secrets stay out of it, and the values mirror
config.example.yaml. Linting, rendering and running the chart with helm:
tests/e2e/test_helm_e2e.py.
"""

from __future__ import annotations

import json
from typing import Any

import promql_parser
import pytest
import yaml

from proxy.config import Settings
from tests.support.helm import CHART, ROOT, _script

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
