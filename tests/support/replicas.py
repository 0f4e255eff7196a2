"""Several proxy replicas sharing one store, as tests/e2e/test_redis.py and
test_topologies.py run them: their config, a chat alternating between them, and what a
replica says of a session."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from tests.support.chat import WINDOW, Chat
from tests.support.servers import OPEN_CLIENTS


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
    r = httpx.get(f"{url}/sessions/{session}", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return dict(r.json())
