"""A stand-in for the Kubernetes API, just enough for ``helm template --dry-run=server``:
discovery, and the reads the chart's ``lookup`` calls make (its Secret, the namespace's
lists). No cluster is reachable from the tests; what lookup sees is what matters."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _resources(*kinds: tuple[str, str, bool]) -> list[dict[str, Any]]:
    verbs = ["get", "list", "create", "update", "patch", "delete"]
    return [
        {"name": name, "singularName": "", "namespaced": ns, "kind": kind, "verbs": verbs}
        for name, kind, ns in kinds
    ]


CORE = _resources(
    ("secrets", "Secret", True),
    ("serviceaccounts", "ServiceAccount", True),
    ("configmaps", "ConfigMap", True),
    ("services", "Service", True),
    ("pods", "Pod", True),
    ("namespaces", "Namespace", False),
)
GROUPS = {
    "apps/v1": _resources(
        ("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)
    ),
    "policy/v1": _resources(("poddisruptionbudgets", "PodDisruptionBudget", True)),
    "networking.k8s.io/v1": _resources(("networkpolicies", "NetworkPolicy", True)),
}


@contextmanager
def fake_cluster(tmp: Path, secrets: dict[str, dict[str, str]]) -> Iterator[Path]:
    """A kubeconfig naming an API on loopback whose namespace ``llm`` holds ``secrets``
    (name -> data, plain), served until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            parts = path.strip("/").split("/")
            if path == "/version":
                return self._send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"})
            if path == "/api":
                return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
            if path == "/apis":
                groups = [
                    {
                        "name": gv.split("/")[0],
                        "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                        "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                    }
                    for gv in GROUPS
                ]
                return self._send(200, {"kind": "APIGroupList", "groups": groups})
            if path == "/api/v1" or path.removeprefix("/apis/") in GROUPS:
                gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
                found = CORE if gv == "v1" else GROUPS[gv]
                return self._send(
                    200, {"kind": "APIResourceList", "groupVersion": gv, "resources": found}
                )
            if len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"]:  # a list
                return self._send(200, {"kind": "List", "apiVersion": "v1", "items": []})
            if len(parts) == 6 and parts[4] == "secrets" and parts[5] in secrets:
                data = {
                    k: base64.b64encode(v.encode()).decode() for k, v in secrets[parts[5]].items()
                }
                meta = {"name": parts[5], "namespace": parts[3]}
                return self._send(
                    200, {"kind": "Secret", "apiVersion": "v1", "metadata": meta, "data": data}
                )
            return self._send(404, {"kind": "Status", "status": "Failure", "code": 404})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp / "kubeconfig"
    url = f"http://127.0.0.1:{server.server_address[1]}"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
                "current-context": "c",
            }
        ),
        encoding="utf-8",
    )
    try:
        yield config
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
