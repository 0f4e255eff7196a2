"""Fairness and cost (issue 20, items 10-12), end to end: the real proxy under uvicorn,
the simulator as upstream, clients over real HTTP.

- 10: one tenant cannot hold every background summary slot while another waits;
- 11: one tenant's flood of sessions never evicts another tenant's session record;
- 12: the summary work a client can buy is bounded: POST /sessions/{id}/compact is
  rate-limited, a summarizer that keeps failing is backed off per session, and one
  compaction spends at most ``compaction.max_summary_calls`` summarizer calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import proxy_settings


def _post(url: str, key: str, session: str, content: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sim-4k", "messages": [{"role": "user", "content": content}]},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )


def test_one_tenants_flood_of_sessions_keeps_another_tenants_session_record(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Item 11: a session not compacted yet is known by its sighting alone; a flood of
    another tenant's new sessions must not push it out (it did: a 404)."""
    settings = proxy_settings(sim_reset, store={"max_sessions": 20, "max_sessions_per_tenant": 5})
    url = start_proxy(settings)
    assert _post(url, "sk-tenant-b", "b-kept", "hello").status_code == 200
    for i in range(40):
        assert _post(url, "sk-tenant-a", f"a-flood-{i}", "hello").status_code == 200
    b = {"Authorization": "Bearer sk-tenant-b"}
    a = {"Authorization": "Bearer sk-tenant-a"}
    kept = httpx.get(f"{url}/sessions/b-kept", headers=b)
    assert kept.status_code == 200, kept.text
    assert kept.json()["version"] == 0 and kept.json()["messages"] == 1
    # The flooder keeps its own newest, and loses its own oldest.
    assert httpx.get(f"{url}/sessions/a-flood-39", headers=a).status_code == 200
    assert httpx.get(f"{url}/sessions/a-flood-0", headers=a).status_code == 404
