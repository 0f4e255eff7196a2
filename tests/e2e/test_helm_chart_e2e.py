"""Issue 23 (items 5 and 6), the chart side, rendered with the pinned helm: declared
Secret keys are required, no manifest holds a password, the bundled store (Valkey) is
locked down, the memory limit follows max_sessions, the drain fits LLM streams, the
disruption budget cannot block a one-replica drain, a soft spread, image digests,
Ingress/HTTPRoute, and the PrometheusRule validated against its CRD's schema.

Lint, schemas and the rest of the chart: tests/e2e/test_helm_e2e.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml
from cryptography.fernet import Fernet

from proxy.config import load_settings
from tests.support.docs import page
from tests.support.helm import (
    CHART,
    ROOT,
    Helm,
    PodWouldNotStart,
    chart_copy,
    config_of,
    container,
    notes,
    one,
    pinned_helm,
    pod_env,
    write,
)
from tests.support.servers import check_server_allowed, free_port, redis_binary

FULL = CHART / "ci" / "full-values.yaml"
CRDS = ROOT / "tests" / "fixtures" / "crds"
CRD_SCHEMA = CRDS / "prometheusrule-v1.json"
BUNDLED: dict[str, Any] = {"redis.bundled.enabled": True}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return pinned_helm(tmp_path_factory)


def _env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(docs).get("env", [])}


def _pod(docs: list[dict[str, Any]], kind: str = "Deployment") -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, kind)["spec"]["template"]["spec"]
    return spec


def _not_secrets(docs: list[dict[str, Any]]) -> str:
    return "\n".join(yaml.safe_dump(d) for d in docs if d["kind"] != "Secret")


# --- item 5: declared keys are required, passwords stay in Secrets ---------------------


@pytest.mark.e2e
def test_every_declared_secret_key_is_required_and_a_missing_one_stops_the_pod(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Fernet.generate_key().decode()
    keys = ["upstream-api-key", "encryption-key"]
    docs = helm.render(sets={"secrets.existingSecret": "keys", "secrets.existingSecretKeys": keys})
    refs = {n: e["valueFrom"]["secretKeyRef"] for n, e in _env(docs).items() if "valueFrom" in e}
    assert refs == {
        "COMPACTION_PROXY_UPSTREAM_API_KEY": {"name": "keys", "key": "upstream-api-key"},
        "COMPACTION_PROXY_ENCRYPTION_KEY": {"name": "keys", "key": "encryption-key"},
    }
    config = yaml.safe_load(config_of(docs))
    assert config["store"]["encryption_keys"] == ["${COMPACTION_PROXY_ENCRYPTION_KEY}"]
    assert "admin_key" not in config["server"]  # not declared: the proxy's default (off)
    # The Secret without its encryption key: the kubelet does not start the container.
    with pytest.raises(PodWouldNotStart, match="encryption-key"):
        pod_env(container(docs), {"keys": {"upstream-api-key": "sk-up"}})
    # With it, the proxy loads the key: summaries are encrypted.
    env = pod_env(container(docs), {"keys": {"upstream-api-key": "sk-up", "encryption-key": key}})
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    (tmp_path / "config.yaml").write_text(config_of(docs), encoding="utf-8")
    settings = load_settings(tmp_path / "config.yaml")
    assert [k.get_secret_value() for k in settings.store.encryption_keys] == [key]


@pytest.mark.e2e
def test_keys_set_in_values_are_required_too(helm: Helm) -> None:
    keys = {"secrets.encryptionKey": Fernet.generate_key().decode()}
    docs = helm.render(sets={**keys, "secrets.tenantIdSecret": "t" * 32})
    refs = [e["valueFrom"]["secretKeyRef"] for e in _env(docs).values() if "valueFrom" in e]
    assert refs == [
        {"name": "rel-compaction-proxy", "key": "encryption-key"},
        {"name": "rel-compaction-proxy", "key": "tenant-id-secret"},
    ]
    assert "optional" not in json.dumps(container(docs))


KEY_ERRORS: dict[str, tuple[dict[str, Any], str]] = {
    "existing-secret-without-its-keys": (
        {"secrets": {"existingSecret": "keys"}},
        "list the keys it holds in secrets.existingSecretKeys",
    ),
    "keys-without-existing-secret": (
        {"secrets": {"existingSecretKeys": ["admin-key"]}},
        "only with secrets.existingSecret",
    ),
    "unknown-key": (
        {"secrets": {"existingSecret": "keys", "existingSecretKeys": ["encryption_key"]}},
        "existingSecretKeys",
    ),
    "previous-key-alone": (
        {"secrets": {"existingSecret": "k", "existingSecretKeys": ["previous-encryption-key"]}},
        "previous-encryption-key needs encryption-key",
    ),
    "ca-twice": (
        {
            "redis": {
                "external": {"url": "rediss://r/0"},
                "tls": {"caSecret": "a", "caConfigMap": "b"},
            }
        },
        "either caSecret or caConfigMap",
    ),
    "ca-without-external-store": (
        {"redis": {"bundled": {"enabled": True}, "tls": {"caSecret": "a"}}},
        "a CA bundle is for an external rediss:// store",
    ),
    "bad-digest": ({"image": {"digest": "latest"}}, "digest"),
    "pdb-that-blocks-drains": (
        {"replicaCount": 2, "redis": {"bundled": {"enabled": True}}}
        | {"podDisruptionBudget": {"minAvailable": 2}},
        "leaves no pod evictable",
    ),
    "pdb-of-100-percent": (
        {"replicaCount": 3, "redis": {"bundled": {"enabled": True}}}
        | {"podDisruptionBudget": {"minAvailable": "100%"}},
        "leaves no pod evictable",
    ),
    "httproute-without-gateway": ({"httpRoute": {"enabled": True}}, "parentRefs"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("case", KEY_ERRORS)
def test_values_that_would_fail_open_or_block_fail_to_render(
    helm: Helm, tmp_path: Path, case: str
) -> None:
    values, message = KEY_ERRORS[case]
    done = helm.template(write(tmp_path / "values.yaml", values))
    assert done.returncode != 0, done.stdout[:500]
    assert message in done.stderr


PASSWORD = "planted-store-password-1234"
URL = f"redis://:{PASSWORD}@redis.data:6379/0"


@pytest.mark.e2e
def test_a_password_in_config_store_url_goes_to_the_secret_not_the_configmap(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = helm.render(sets={"config.store.url": URL, "replicaCount": 2})
    assert PASSWORD not in _not_secrets(docs)
    secret = one(docs, "Secret")
    assert base64.b64decode(secret["data"]["redis-url"]).decode() == URL
    config = yaml.safe_load(config_of(docs))
    assert config["store"]["url"] == "${COMPACTION_PROXY_STORE_URL}"
    for var, value in pod_env(
        container(docs), {"rel-compaction-proxy": {"redis-url": URL}}
    ).items():
        monkeypatch.setenv(var, value)
    (tmp_path / "config.yaml").write_text(config_of(docs), encoding="utf-8")
    assert load_settings(tmp_path / "config.yaml").store.url == URL
    # What helm prints after install does not show it either.
    shown = notes(helm.render(sets={"config.store.url": URL}, chart=chart_copy(tmp_path)))
    assert PASSWORD not in shown
    assert "external Redis (URL from Secret rel-compaction-proxy)" in shown


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["defaults", "full-example", "bundled", "keys", "config-url"])
def test_no_rendered_manifest_but_a_secret_holds_a_password(helm: Helm, name: str) -> None:
    planted = {
        "secrets.upstreamApiKey": "sk-planted-upstream-0123456789",
        "secrets.adminKey": "planted-admin-key-9876",
        "secrets.encryptionKey": Fernet.generate_key().decode(),
        "secrets.tenantIdSecret": "planted-tenant-id-secret-0123456789",
        "redis.external.url": URL,
    }
    renderings: dict[str, tuple[tuple[Path, ...], dict[str, Any]]] = {
        "defaults": ((), {}),
        "full-example": ((FULL,), {}),
        "bundled": ((), {**BUNDLED, "replicaCount": 2}),
        "keys": ((), planted),
        "config-url": ((), {"config.store.url": URL}),
    }
    values, sets = renderings[name]
    docs = helm.render(*values, sets=sets)
    secrets = [
        base64.b64decode(v).decode()
        for d in docs
        if d["kind"] == "Secret"
        for v in d["data"].values()
    ]
    text = _not_secrets(docs)
    for value in [*secrets, *(v for v in sets.values() if isinstance(v, str) and len(v) > 8)]:
        if value.startswith("redis://:"):
            value = PASSWORD
        assert value not in text
        assert base64.b64encode(value.encode()).decode() not in text
    assert not re.search(r"redis://:[^$]", text)  # no password written into any URL


# --- item 5: the Redis CA bundle ---------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("url", "suffix"),
    [
        ("rediss://:pw@r:6380/0", "?ssl_ca_certs=/etc/compaction-proxy/redis-ca/ca.crt"),
        (
            "rediss://r:6380/0?ssl_check_hostname=true",
            "&ssl_ca_certs=/etc/compaction-proxy/redis-ca/ca.crt",
        ),
    ],
)
def test_the_redis_ca_bundle_is_mounted_and_given_to_the_store(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, suffix: str
) -> None:
    docs = helm.render(sets={"redis.external.url": url, "redis.tls.caSecret": "redis-ca"})
    pod = _pod(docs)
    [volume] = [v for v in pod["volumes"] if v["name"] == "redis-ca"]
    assert volume["secret"] == {
        "secretName": "redis-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert mounts["redis-ca"] == {
        "name": "redis-ca",
        "mountPath": "/etc/compaction-proxy/redis-ca",
        "readOnly": True,
    }
    env = pod_env(container(docs), {"rel-compaction-proxy": {"redis-url": url}})
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    (tmp_path / "config.yaml").write_text(config_of(docs), encoding="utf-8")
    assert load_settings(tmp_path / "config.yaml").store.url == url + suffix
    from_map = helm.render(sets={"redis.external.url": url, "redis.tls.caConfigMap": "cas"})
    [volume] = [v for v in _pod(from_map)["volumes"] if v["name"] == "redis-ca"]
    assert volume["configMap"]["name"] == "cas"
    assert "redis-ca" not in json.dumps(helm.render(sets={"redis.external.url": url}))


# --- item 6: the bundled store ----------------------------------------------------------


@pytest.mark.e2e
def test_the_bundled_store_is_valkey_with_a_generated_password_and_protected_mode(
    helm: Helm, tmp_path: Path
) -> None:
    docs = helm.render(sets=BUNDLED)
    store = _pod(docs, "StatefulSet")["containers"][0]
    assert store["image"].startswith("valkey/valkey:")
    assert store["command"] == ["valkey-server"]
    args = store["args"]
    assert args[args.index("--protected-mode") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(VALKEY_PASSWORD)"
    secret = one(docs, "Secret", "-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    ref = {"name": secret["metadata"]["name"], "key": "password"}
    store_env = {e["name"]: e for e in store["env"]}
    assert store_env["VALKEY_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
    assert _env(docs)["COMPACTION_PROXY_STORE_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
    assert password not in _not_secrets(docs)
    # Generated per install (helm template has no cluster to look the old one up in)...
    again = one(helm.render(sets=BUNDLED), "Secret", "-redis")["data"]["password"]
    assert again != secret["data"]["password"]
    # ...and kept across upgrades: the template reads the installed Secret back first.
    template = (CHART / "templates" / "redis.yaml").read_text(encoding="utf-8")
    assert 'lookup "v1" "Secret" .Release.Namespace $name' in template
    shown = notes(helm.render(sets=BUNDLED, chart=chart_copy(tmp_path)))
    assert "the bundled Valkey (rel-compaction-proxy-redis, password in Secret" in shown
    # Or an existing Secret's: then the chart generates none.
    given = helm.render(sets={**BUNDLED, "redis.bundled.existingSecret": "store-auth"})
    assert not [d for d in given if d["kind"] == "Secret"]
    given_ref = _env(given)["COMPACTION_PROXY_STORE_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert given_ref == {"name": "store-auth", "key": "password"}


@pytest.mark.e2e
def test_only_the_proxy_reaches_the_bundled_store_even_without_network_policies(
    helm: Helm,
) -> None:
    docs = helm.render(sets={**BUNDLED, "networkPolicy.enabled": False})
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["name"].endswith("-redis")
    proxy_labels = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": proxy_labels}}],
            "ports": [{"port": 6379, "protocol": "TCP"}],
        }
    ]
    store_labels = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == store_labels


# --- item 6: sizing, drain, disruption, spread, image -----------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "limit"),
    [
        ({}, f"{1 * (128 + 100 * 16) + 384}Mi"),  # max_sessions 100000, one worker
        (
            {"config.store.max_sessions": 20000, "config.server.workers": 2, **BUNDLED},
            f"{2 * (128 + 20 * 16) + 384}Mi",
        ),
        ({"config.store.max_sessions": 1500}, f"{128 + 2 * 16 + 384}Mi"),  # thousands rounded up
        ({"memorySizing.perThousandSessionsMiB": 20}, f"{128 + 100 * 20 + 384}Mi"),
        ({"resources.limits.memory": "3Gi"}, "3Gi"),
    ],
)
def test_the_memory_limit_follows_max_sessions(
    helm: Helm, sets: dict[str, Any], limit: str
) -> None:
    resources = container(helm.render(sets=sets))["resources"]
    assert resources["limits"]["memory"] == limit
    assert resources["requests"] == {"cpu": "250m", "memory": "256Mi"}


@pytest.mark.e2e
def test_the_default_drain_lets_llm_streams_finish(helm: Helm) -> None:
    docs = helm.render()
    config = yaml.safe_load(config_of(docs))
    assert config["server"]["shutdown_timeout_s"] == 300
    assert config["upstream"]["timeout_s"] == 600
    assert _pod(docs)["terminationGracePeriodSeconds"] == 5 + 0 + 300 + 5


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "budget"),
    [
        ({}, None),  # one replica: no budget to block a node drain
        ({"replicaCount": 2, **BUNDLED}, {"maxUnavailable": 1}),
        (
            {"replicaCount": 3, "podDisruptionBudget.minAvailable": 2, **BUNDLED},
            {"minAvailable": 2},
        ),
        ({"autoscaling.enabled": True, "autoscaling.minReplicas": 1, **BUNDLED}, None),
        ({"replicaCount": 2, "podDisruptionBudget.enabled": False, **BUNDLED}, None),
    ],
)
def test_the_disruption_budget_never_blocks_a_one_replica_drain(
    helm: Helm, sets: dict[str, Any], budget: dict[str, Any] | None
) -> None:
    pdbs = [d for d in helm.render(sets=sets) if d["kind"] == "PodDisruptionBudget"]
    if budget is None:
        assert pdbs == []
    else:
        [pdb] = pdbs
        assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == budget


@pytest.mark.e2e
def test_replicas_spread_softly_over_nodes_and_zones_by_default(helm: Helm) -> None:
    docs = helm.render()
    labels = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    spread = _pod(docs)["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in spread] == [
        ("kubernetes.io/hostname", "ScheduleAnyway"),
        ("topology.kubernetes.io/zone", "ScheduleAnyway"),
    ]
    assert all(c["labelSelector"] == {"matchLabels": labels} for c in spread)
    assert "topologySpreadConstraints" not in _pod(
        helm.render(sets={"defaultTopologySpread": False})
    )
    own = yaml.safe_load(FULL.read_text())["topologySpreadConstraints"]
    assert _pod(helm.render(FULL))["topologySpreadConstraints"] == own


@pytest.mark.e2e
def test_an_image_digest_pins_the_image(helm: Helm) -> None:
    digest = "sha256:" + "ab" * 32
    image = container(helm.render(sets={"image.digest": digest}))["image"]
    assert image == f"compaction-proxy:0.1.0@{digest}"
    assert container(helm.render())["image"] == "compaction-proxy:0.1.0"


# --- item 6: Ingress, HTTPRoute ---------------------------------------------------------


@pytest.mark.e2e
def test_ingress_and_httproute_are_off_by_default_and_route_to_the_service(helm: Helm) -> None:
    kinds = {d["kind"] for d in helm.render()}
    assert not kinds & {"Ingress", "HTTPRoute"}
    docs = helm.render(FULL)
    ingress = one(docs, "Ingress")
    kubernetes_validate.validate(ingress, kubernetes_validate.utils.latest_version(), strict=True)
    [path] = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"] == {
        "service": {"name": "rel-compaction-proxy", "port": {"name": "http"}}
    }
    assert ingress["spec"]["ingressClassName"] == "nginx"
    route = one(
        helm.render(
            sets={
                "httpRoute.enabled": True,
                "httpRoute.parentRefs": [{"name": "public", "namespace": "gateways"}],
                "httpRoute.hostnames": ["llm.example.com"],
                "httpRoute.timeouts": {"request": "1800s"},
            }
        ),
        "HTTPRoute",
    )
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    schema = json.loads((CRDS / "httproute-v1.json").read_text(encoding="utf-8"))
    jsonschema.validate(route, schema)
    wrong = json.loads(json.dumps(route))
    wrong["spec"]["rules"][0]["timeouts"] = {"request": "30 minutes"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema)
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "rel-compaction-proxy", "port": 8080}]
    assert rule["timeouts"] == {"request": "1800s"}


# --- item 6: PrometheusRule -------------------------------------------------------------


def _documented_rules() -> list[tuple[str, str, str]]:
    """(name, expression, for) of each row of the alerts table (docs/kubernetes.md)."""
    text = page("kubernetes.md")
    table = text[text.index("**Alerts**") :].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| ([^|]+) \|", table, re.MULTILINE)


@pytest.mark.e2e
def test_the_prometheus_rule_is_the_documented_alerts_table_and_fits_the_crd(helm: Helm) -> None:
    assert not [d for d in helm.render() if d["kind"] == "PrometheusRule"]
    extra = {"record": "x:y:rate5m", "expr": "sum(rate(compaction_proxy_responses_total[5m]))"}
    docs = helm.render(FULL, sets={"metrics.prometheusRule.additionalRules": [extra]})
    rule = one(docs, "PrometheusRule")
    jsonschema.validate(rule, json.loads(CRD_SCHEMA.read_text(encoding="utf-8")))
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    [group] = rule["spec"]["groups"]
    *rendered, added = group["rules"]
    assert added == extra
    documented = _documented_rules()
    assert len(documented) >= 6
    # The docs write the proxy's scrape targets as the rule file does (job="compaction-proxy").
    targets = 'job="rel-compaction-proxy",namespace="llm"'
    assert [
        (
            r.get("alert") or r["record"],
            r["expr"].replace(targets, 'job="compaction-proxy"'),
            r.get("for", "(recorded)"),
        )
        for r in rendered
    ] == [(name, expr, when.strip()) for name, expr, when in documented]
    for r in rendered:
        if "alert" in r:
            assert r["labels"] == {"severity": "warning", "team": "platform"}
            assert r["annotations"]["summary"]
            runbook = "https://git.example.com/platform/compaction-proxy/blob/main/docs/runbook.md#"
            assert r["annotations"]["runbook_url"].startswith(runbook)


@pytest.mark.e2e
def test_the_crd_schema_refuses_what_the_operator_would(helm: Helm) -> None:
    """The schema in the test data is not a formality: a misspelt field, a bad duration
    or a rule without expr fail it."""
    schema = json.loads(CRD_SCHEMA.read_text(encoding="utf-8"))
    monitored = {
        "metrics.prometheusRule.enabled": True,
        "metrics.serviceMonitor.enabled": True,
        "metrics.prometheusRule.runbookUrl": "https://runbooks.example.com/compaction-proxy.md",
    }
    rule = one(helm.render(sets=monitored), "PrometheusRule")
    jsonschema.validate(rule, schema)
    broken: list[dict[str, Any]] = [
        {"alert": "A", "expr": "up", "for": "5 minutes"},
        {"alert": "A"},
        {"alert": "A", "expr": "up", "severity": "page"},
    ]
    for bad in broken:
        wrong = json.loads(json.dumps(rule))
        wrong["spec"]["groups"][0]["rules"].append(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


@pytest.mark.parametrize(
    ("name", "source"),
    [("prometheusrule-v1.json", "prometheus-operator"), ("httproute-v1.json", "gateway-api")],
)
def test_crd_schema_test_data_says_where_it_comes_from(name: str, source: str) -> None:
    schema = json.loads((CRDS / name).read_text(encoding="utf-8"))
    assert source in schema["$comment"]
    jsonschema.Draft7Validator.check_schema(schema)


def _kubelet(value: str, env: dict[str, str]) -> str:
    """$(VAR) in a container's args or env, as the kubelet expands it."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


@pytest.mark.e2e
def test_the_bundled_store_command_line_refuses_strangers_and_serves_the_proxy(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The StatefulSet's arguments, run on loopback (redis-server standing in for
    valkey-server: the same flags), the probe's client with its password from the
    environment, and the proxy's rendered config reaching it."""
    docs = helm.render(sets=BUNDLED)
    secret = one(docs, "Secret", "-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    store = _pod(docs, "StatefulSet")["containers"][0]
    env: dict[str, str] = {"VALKEY_PASSWORD": password}
    for var in store["env"]:
        if "value" in var:
            env[var["name"]] = _kubelet(var["value"], env)
    port = free_port()
    args = [_kubelet(a, env) for a in store["args"]]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dir") + 1] = str(tmp_path)
    check_server_allowed()
    server = subprocess.Popen(
        [redis_binary(), *args, "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        cli = ["redis-cli", "-p", str(port)]
        deadline = time.monotonic() + 10
        while "PONG" not in _run([*cli, "ping"], {"REDISCLI_AUTH": env["REDISCLI_AUTH"]}):
            assert time.monotonic() < deadline, "the store did not start"
            time.sleep(0.05)
        assert "NOAUTH" in _run([*cli, "ping"], {})  # no password, no answer
        # The server's process title replaced its arguments: no password in `ps`.
        with open(f"/proc/{server.pid}/cmdline", "rb") as cmdline:
            assert password.encode() not in cmdline.read()
        # The proxy, with its rendered config and environment, reaches it.
        proxy_env = pod_env(container(docs), {secret["metadata"]["name"]: {"password": password}})
        for var, value in proxy_env.items():
            monkeypatch.setenv(var, value)
        config = yaml.safe_load(config_of(docs))
        config["store"]["url"] = config["store"]["url"].replace(
            "rel-compaction-proxy-redis:6379", f"127.0.0.1:{port}"
        )
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        url = load_settings(tmp_path / "config.yaml").store.url
        assert url == f"redis://:{password}@127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            assert client.ping()
            assert client.config_get("protected-mode") == {"protected-mode": "yes"}
        finally:
            client.close()
    finally:
        server.kill()
        server.wait(timeout=10)


def _run(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        cmd, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=10
    )
    return done.stdout + done.stderr
