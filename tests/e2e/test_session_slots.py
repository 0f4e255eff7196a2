"""Issue 24 item 1 end to end: several conversations under one session name, and a
client that rewinds, each keep a snapshot of their own (``session.explicit_slots``).
Real proxy under uvicorn, the openai SDK as client, the simulator as upstream; summaries
are the simulator's requests marked ``X-Compaction-Purpose: summarize``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.chat import FILLER, WINDOW, Chat, stats, upstream_requests
from tests.support.metrics import metric
from tests.support.servers import RedisServer, proxy_settings

TURNS = 60


def summaries(sim: str) -> int:
    return int(stats(sim)["summaries"])


def run(chats: list[Chat], sim: str) -> list[int]:
    """Each chat plants a fact, takes ``TURNS`` turns in alternation, then recalls its
    fact; the summaries each one's turns cost."""
    cost = [0] * len(chats)

    def say(i: int, text: str) -> str:
        before = summaries(sim)
        answer = chats[i].say(text)
        cost[i] += summaries(sim) - before
        return answer

    for i in range(len(chats)):
        say(i, f"I am conversation {i}. FACT who{i}=c{i}")
    for turn in range(TURNS):
        for i in range(len(chats)):
            say(i, f"Conversation {i} turn {turn}: {FILLER}")
    for i in range(len(chats)):
        assert say(i, f"RECALL who{i}") == f"who{i}=c{i}"
    return cost


def alone_and_together(proxy: str, sim: str, count: int) -> None:
    alone = [run([Chat(proxy, session=f"alone-{i}")], sim)[0] for i in range(count)]
    together = run([Chat(proxy, session="shared") for _ in range(count)], sim)
    print(f"{count} conversations: alone {alone}, together {together}")
    assert all(n >= 1 for n in alone)  # each compacts when alone
    for own, shared in zip(alone, together, strict=True):
        assert shared <= own + 1, (alone, together)
    marked = [r for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose")]
    assert len(marked) == sum(alone) + sum(together)
    # Enough slots: no conversation's snapshot was evicted for another's.
    assert metric(proxy, "compaction_proxy_session_slot_misses", outcome="evicted") == 0
    assert metric(proxy, "compaction_proxy_session_slot_misses", outcome="free") >= count - 1
    # The name's every conversation is forgotten at once.
    url, auth = f"{proxy}/sessions/shared", {"Authorization": "Bearer sk-tenant-a"}
    assert httpx.get(url, headers=auth).json()["version"] >= 1
    assert httpx.delete(url, headers=auth).status_code == 200
    assert httpx.get(url, headers=auth).status_code == 404


def settings(sim: str, **sections: Any) -> Any:
    """The 4k model of tests/support/chat.py, with ``sections`` (store, session) set."""
    return proxy_settings(
        sim,
        models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, "precompact_ratio": None},
        **sections,
    )


@pytest.mark.parametrize("count", [2, 4])
def test_conversations_alternating_under_one_name_compact_as_often_as_alone(
    count: int, sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    alone_and_together(start_proxy(settings(sim_reset)), sim_reset, count)


@pytest.mark.redis
@pytest.mark.parametrize("count", [2, 4])
def test_conversations_alternating_under_one_name_on_redis(
    count: int, sim_reset: str, redis_server: RedisServer, start_proxy: Callable[..., str]
) -> None:
    proxy = start_proxy(settings(sim_reset, store={"url": redis_server.url}))
    alone_and_together(proxy, sim_reset, count)


def rewind_cost(proxy: str, sim: str, session: str) -> int:
    """Summaries of one turn of a client that rewinds past its session's newest cut,
    to a point after the one before (an edited message, a regenerated answer)."""
    chat = Chat(proxy, session=session)
    chat.say("FACT planet=mars")
    cuts: list[int] = []
    turn = 0
    while len(cuts) < 2:
        chat.say(f"Turn {turn}: {FILLER}")
        turn += 1
        info = httpx.get(
            f"{proxy}/sessions/{session}", headers={"Authorization": f"Bearer {chat.key}"}
        ).json()
        if info["version"] > len(cuts):
            cuts.append(max(info["covered_messages"], info["elided_before"]))
        assert turn < 60
    older, newest = cuts
    keep = newest - 1 if newest % 2 == 0 else newest - 2  # ends with an answer
    assert older < keep < newest
    del chat.history[keep:]
    before = summaries(sim)
    chat.say(f"Let us go another way instead. {FILLER}")
    cost = summaries(sim) - before
    assert chat.say("RECALL planet") == "planet=mars"
    return cost


@pytest.mark.parametrize("redis", [False, pytest.param(True, marks=pytest.mark.redis)])
def test_a_rewind_past_the_newest_cut_reuses_the_older_snapshot(
    redis: bool, sim_reset: str, start_proxy: Callable[..., str], request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("redis_server").url if redis else "memory://"
    one_slot = start_proxy(settings(sim_reset, store={"url": url}, session={"explicit_slots": 1}))
    without = rewind_cost(one_slot, sim_reset, "rewind-one-slot")
    with_slots = rewind_cost(
        start_proxy(settings(sim_reset, store={"url": url})), sim_reset, "rewind"
    )
    print(f"rewind summaries: one slot {without}, slots {with_slots}")
    # One snapshot per name: the rewound history plans from scratch (a compaction, its
    # summary in one or more calls); with slots, the older snapshot still fits it.
    assert with_slots == 0 < without
