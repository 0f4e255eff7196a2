"""Reading a running proxy's /metrics, and the traffic the metrics tests send."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import openai

from tests.support.chat import FILLER
from tests.support.servers import OPEN_CLIENTS


def client(url: str, key: str = "sk-metrics") -> openai.OpenAI:
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    OPEN_CLIENTS.append(sdk)
    return sdk


def long_history(messages: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for i in range(messages):
        role = "user" if i % 2 == 0 else "assistant"
        history.append({"role": role, "content": f"Turn {i}: {FILLER}"})
    history.append({"role": "user", "content": "And now?"})
    return history


def metric(url: str, name: str, **labels: str) -> float:
    """A metric's value from /metrics (a counter's ``_total``); 0 when absent."""
    text = httpx.get(f"{url}/metrics").text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}(?:_total)?(?:\{{(.*)\}})? (\S+)$", line)
        if match and (not wanted or wanted in (match.group(1) or "")):
            total += float(match.group(2))
    return total


def wait_for_idle(url: str, timeout_s: float = 10) -> None:
    """Until no background compaction runs (bounded)."""
    deadline = time.monotonic() + timeout_s
    while metric(url, "compaction_proxy_precompactions_running") > 0:
        assert time.monotonic() < deadline, "background compactions did not finish"
        time.sleep(0.05)


def exact_metric(url: str, name: str) -> float:
    """The one unlabelled sample named ``name``; 0 when absent."""
    text = httpx.get(f"{url}/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
