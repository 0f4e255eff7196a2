"""Several proxy replicas sharing one store, as tests/e2e/test_redis.py and
test_topologies.py run them: their config, a chat alternating between them, and what a
replica says of a session."""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai

from tests.support.chat import WINDOW, Chat
from tests.support.servers import OPEN_CLIENTS, RedisServer


def replica_config(sim: str, redis_url: str) -> dict[str, Any]:
    return {
        "upstream": {"base_url": f"{sim}/v1"},
        "store": {"url": redis_url},
        "models": [{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        "compaction": {"summary_max_tokens": 400, "precompact_ratio": None},
    }


class ReplicaChat(Chat):
    """Alternates its turns between several proxy replicas."""

    def __init__(self, urls: list[str], **kw: Any) -> None:
        super().__init__(urls[0], **kw)
        self.clients = [
            openai.OpenAI(base_url=f"{u}/v1", api_key=self.key, max_retries=0) for u in urls
        ]
        OPEN_CLIENTS.extend(self.clients)
        self.turn = 0

    def send(self, **extra: Any) -> Any:
        self.client = self.clients[self.turn % len(self.clients)]
        self.turn += 1
        return super().send(**extra)


def session_info(url: str, session: str, key: str = "sk-tenant-a") -> dict[str, Any]:
    """What the replica at ``url`` says of ``session``, less its ``ledger``: each process
    keeps its own totals (``"scope": "process"``), so replicas agree on all but that."""
    r = httpx.get(f"{url}/sessions/{session}", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    info = dict(r.json())
    assert info.pop("ledger")["scope"] == "process"
    return info


def stored_version(node: RedisServer) -> int:
    """The highest snapshot version on ``node`` (a session may fill several slots)."""
    client = node.client()
    try:
        versions = [int(client.hget(k, "v") or 0) for k in client.scan_iter("cp:snap:*")]
    finally:
        client.close()
    return max(versions, default=0)


def store_errors(url: str) -> float:
    """The proxy at ``url``'s failed store calls, every operation summed."""
    text = httpx.get(f"{url}/metrics").text
    found = re.findall(r"^compaction_proxy_store_errors_total\{.*\} (\S+)$", text, re.M)
    return sum(float(n) for n in found)
