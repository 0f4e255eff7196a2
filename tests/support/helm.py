"""The repository root, the Helm chart, and the scripts/ modules the chart tests load."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


CHART = ROOT / "helm" / "compaction-proxy"
RUNBOOK = ROOT / "docs" / "runbook.md"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Helm:
    """Runs the pinned helm with its own empty home, so no user config leaks in."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str | Path, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *[str(a) for a in args], str(chart)]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)

    def template(
        self,
        *values: Path,
        sets: dict[str, Any] | None = None,
        chart: Path = CHART,
    ) -> subprocess.CompletedProcess[str]:
        args: list[str | Path] = ["template", "--namespace", "llm"]
        for file in values:
            args += ["-f", file]
        for key, value in (sets or {}).items():
            args += ["--set-json", f"{key}={json.dumps(value)}"]
        # The release name goes before the chart.
        return self.run(*args, "rel", chart=chart)

    def render(
        self, *values: Path, sets: dict[str, Any] | None = None, chart: Path = CHART
    ) -> list[dict[str, Any]]:
        done = self.template(*values, sets=sets, chart=chart)
        assert done.returncode == 0, done.stderr
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def pinned_helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The pinned helm (scripts/_helm.py), for a module-scoped ``helm`` fixture."""
    # The same command a developer runs; a non-zero exit fails every test here, never skips.
    fetch = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "_helm.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if fetch.returncode != 0:
        pytest.fail(f"no helm binary (scripts/_helm.py): {fetch.stderr.strip()}")
    return Helm(Path(fetch.stdout.strip()), tmp_path_factory.mktemp("helm-home"))


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind}*{name_suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def config_of(docs: list[dict[str, Any]]) -> str:
    data: dict[str, str] = one(docs, "ConfigMap", "compaction-proxy")["data"]
    return data["config.yaml"]


def pod_annotations(docs: list[dict[str, Any]]) -> dict[str, str]:
    annotations: dict[str, str] = one(docs, "Deployment")["spec"]["template"]["metadata"][
        "annotations"
    ]
    return annotations


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


def write(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


class PodWouldNotStart(AssertionError):
    """A required Secret key is missing: the kubelet refuses to start the container
    (CreateContainerConfigError)."""


def pod_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet would set it from these Secrets."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        value = secrets.get(ref["name"], {}).get(ref["key"])
        if value is not None:
            env[var["name"]] = value
        elif not ref.get("optional"):
            raise PodWouldNotStart(f"{var['name']}: {ref} is missing and not optional")
    return env


def chart_copy(tmp_path: Path) -> Path:
    """The chart without its dashboards, plus a ConfigMap holding what NOTES.txt prints."""
    chart = tmp_path / "compaction-proxy"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("dashboards"))
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "compaction-proxy.notes" . | toJson }}}\n',
        encoding="utf-8",
    )
    return chart


def notes(docs: list[dict[str, Any]]) -> str:
    notes: str = one(docs, "ConfigMap", "notes")["data"]["notes"]
    return notes


def runbook_sections(markdown: str) -> dict[str, str]:
    """Each heading's anchor, as GitHub (and MkDocs' default toc) make it, to the text
    under it; fenced code (its ``#`` comments) is not a heading."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    sections = re.split(r"^#{1,6} (.+)$", prose, flags=re.MULTILINE)
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"): body
        for title, body in zip(sections[1::2], sections[2::2], strict=True)
    }
