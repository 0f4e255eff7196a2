"""Issue 10: the Grafana dashboard the chart ships queries only series the proxy exports.

Every PromQL expression in the dashboard (panels and template variables) is taken
apart into the metric names and label names it uses (tests/support/dashboard.py).
Each name a series a live proxy exports after traffic: tests/e2e/test_dashboard_e2e.py.
"""

from __future__ import annotations

import re

import promql_parser
import pytest

from proxy.observe.ledger import Ledger
from proxy.observe.metrics import Metrics
from tests.support.dashboard import (
    dashboard,
    expressions,
    panels,
    referenced,
)


@pytest.mark.parametrize(
    ("expr", "names", "labels"),
    [
        ("up", {"up"}, set()),
        (
            'histogram_quantile(0.99, sum by (le, route) (rate(x_bucket{job=~"$job", a="b{c}"}'
            "[$__rate_interval])))",
            {"x_bucket"},
            {"le", "route", "job", "a"},
        ),
        ("1 - sum(rate(a_total[5m])) / sum(rate(b_total[5m]))", {"a_total", "b_total"}, set()),
        ('min by (model) (g{x!="1"}) > bool 0', {"g"}, {"model", "x"}),
        ('label_values(c_total{job=~"$job"}, instance)', {"c_total"}, {"job", "instance"}),
    ],
)
def test_expressions_are_taken_apart_into_metrics_and_labels(
    expr: str, names: set[str], labels: set[str]
) -> None:
    assert referenced(expr) == (names, labels)


def test_the_dashboard_takes_its_datasource_from_a_variable() -> None:
    """Loadable by Grafana's sidecar as is: no import-time inputs, no fixed datasource."""
    board = dashboard()
    assert "__inputs" not in board
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    uids = {p["datasource"]["uid"] for p in panels(board) if p["type"] != "row"}
    uids |= {t["datasource"]["uid"] for p in panels(board) for t in p.get("targets", [])}
    assert uids == {"${datasource}"}
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))


def test_every_family_a_fresh_proxy_declares_is_on_the_dashboard() -> None:
    """Nothing the proxy measures is left off the dashboard: a new metric needs a panel."""
    metrics = Metrics.create()
    Ledger(metrics.registry, [])  # its series (and shadow mode's) on the same registry
    declared = {
        family.name
        for family in metrics.registry.collect()
        if not family.name.startswith(("python_", "process_"))
    }
    used = set().union(*(referenced(e)[0] for e in expressions(dashboard())))
    shown = {re.sub(r"(_total|_bucket|_count|_sum)$", "", name) for name in used}
    assert declared - shown == set()


def test_compaction_panels_do_not_count_served_snapshots_as_compactions() -> None:
    """Issue 23: outcome="snapshot" is a turn served from another request's summary."""
    queries = [e for e in expressions(dashboard()) if "compaction_proxy_compactions_total" in e]
    assert queries
    assert all('outcome!="snapshot"' in e for e in queries), queries


def test_every_dashboard_query_is_valid_promql() -> None:
    """With Grafana's variables put in as Prometheus would receive them."""
    filled = {"$__rate_interval": "5m", "$job": ".*", "$instance": ".*"}
    for expr in expressions(dashboard()):
        if expr.startswith("label_values("):
            continue
        for variable, value in filled.items():
            expr = expr.replace(variable, value)
        promql_parser.parse(expr)
