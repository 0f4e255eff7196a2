"""Background pre-compaction in-process: Services with nothing listening upstream, the
job a turn would leave, the outcomes counted, and a conversation between the soft
threshold and the trigger."""

from __future__ import annotations

from typing import Any

from proxy.compaction.count import count_history
from proxy.compaction.job import Job
from proxy.compaction.precompact import background_budget
from proxy.config import CompactionSettings, Settings
from proxy.core.budget import Budget
from proxy.core.outcome import Turn
from proxy.core.session import session_from_header
from proxy.services import Services, build_services
from tests.support.chat import FILLER, WINDOW


async def _services(upstream: str = "http://127.0.0.1:9/v1", **compaction: Any) -> Services:
    """Nothing listens on the discard port: a summary call there fails at once."""
    model = {"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}
    settings = Settings(upstream={"base_url": upstream}, models=[model], compaction=compaction)
    return await build_services(settings)


def _conversation(turns: int, newest: str = "and now?") -> list[Any]:
    """A system prompt, ``turns`` user messages of ~75 tokens, then ``newest``."""
    messages: list[Any] = [{"role": "system", "content": "You are helpful."}]
    messages += [{"role": "user", "content": f"turn {i}: {FILLER}"} for i in range(turns)]
    return [*messages, {"role": "user", "content": newest}]


async def _job(services: Services, session: str, messages: list[Any]) -> Job:
    """The background job a turn sending ``messages`` would leave for its session."""
    chat: Any = {"model": "sim-4k", "messages": messages}
    model = services.models.resolve("sim-4k")
    turn = Turn(chat, b"{}", model, "tenant", session, [])
    history = await count_history(services.counters[model.tokenizer], turn, CompactionSettings(), 0)
    budget = Budget.for_model(model, services.settings.compaction, 256, history.fixed)
    key = session_from_header("tenant", session)
    early = background_budget(budget, services.settings.compaction)
    return Job(turn, key, history, early, "precompact", background=True)


def _outcomes(services: Services) -> dict[str, float]:
    found: dict[str, float] = {}
    for metric in services.metrics.precompactions.collect():
        for s in metric.samples:
            if s.name.endswith("_total") and s.value:  # every outcome exists from start-up
                found[s.labels["outcome"]] = s.value
    return found


def over_soft_threshold(label: str) -> list[dict[str, Any]]:
    """A conversation past 60% of the 4k window but below the 80% trigger."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(28):
        history.append({"role": "user", "content": f"{label} turn {turn}: {FILLER}"})
        history.append({"role": "assistant", "content": f"ok {turn}"})
    history.append({"role": "user", "content": f"{label}: and now?"})
    return history
