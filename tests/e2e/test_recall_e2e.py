"""Nothing the client sent is lost: with a summarizer that keeps nothing, the facts of a
long conversation come back from the archive of originals as verbatim excerpts, placed
before the newest user message, and the prefix the provider caches stays byte-stable.

The simulator's summarizer here forgets every fact (``summary_forgets: 1``); facts are
stated in varied sentences, each with a ``FACT key=value`` a reader of the excerpt's
verbatim text (the simulator's RECALL rule) answers from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from proxy.core.wording import HANDOFF_INTRO
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import (
    FILLER,
    WINDOW,
    Chat,
    chat_requests,
    small_window_settings,
    without_excerpts,
)
from tests.support.metrics import exact_metric, metric
from tests.support.replicas import session_info
from tests.support.servers import proxy_settings, run_server

TURNS = 200
QUESTIONS = 30
# Varied sentences around each fact: a person, a date, an amount, a path, an id, a setting.
PHRASINGS = (
    "By the way, the person who signs off on this is someone to remember: FACT {k}={v} is who.",
    "We agreed on a date in the planning call yesterday, write it down: FACT {k}={v}",
    "Finance confirmed the figure after some back and forth; FACT {k}={v} is final.",
    "The file we keep coming back to lives where I said before, FACT {k}={v} on the share.",
    "Ticket triage gave us an identifier for it - FACT {k}={v} - keep it handy.",
    "One setting matters for the rollout, the others do not: FACT {k}={v}",
)
TOPICS = ("approver", "launch", "budget", "config", "ticket", "timeout")


@pytest.fixture
def forgetful_sim() -> Iterator[str]:
    """A 4k model whose summaries carry no fact at all."""
    rule = ModelRule(match="sim-4k", summary_style="ideal", summary_forgets=1)
    with run_server(create_simulator_app(SimulatorConfig(models=(rule,)))) as url:
        yield url


def facts_for(turns: int) -> dict[int, tuple[str, str]]:
    """120 facts over 200 turns (three turns in five), keys and values all distinct."""
    facts = {}
    for turn in range(turns):
        if turn % 5 in (0, 1, 3):
            n = len(facts)
            facts[turn] = (f"{TOPICS[n % 6]}_{n}", f"val{n * 37 + 11}q{turn}")
    return facts


def play(chat: Chat, facts: dict[int, tuple[str, str]]) -> None:
    for turn in range(TURNS):
        said = f"Turn {turn}: {FILLER}"
        if turn in facts:
            k, v = facts[turn]
            said += " " + PHRASINGS[turn % len(PHRASINGS)].format(k=k, v=v)
        chat.say(said)


def ask(chat: Chat, facts: dict[int, tuple[str, str]]) -> tuple[int, int, list[int]]:
    """30 questions about facts stated at least 40 turns before them: how many answered
    right, how many with another fact's value, and each answer's X-Compaction-Recalled."""
    old = [t for t in facts if t <= TURNS - 40]
    asked = old[:: len(old) // QUESTIONS][:QUESTIONS]
    values = {v for _, v in facts.values()}
    right = wrong = 0
    recalled = []
    for turn in asked:
        k, v = facts[turn]
        topic = k.split("_")[0]
        answer = chat.say(f"Quick question about the {topic} we noted, {k}: RECALL {k}")
        assert chat.last is not None
        recalled.append(int(chat.last.get("x-compaction-recalled", "-1")))
        if answer == f"{k}={v}":
            right += 1
        elif answer.partition("=")[2] in values:
            wrong += 1
    return right, wrong, recalled


def settings(sim: str, recall: bool) -> Any:
    ratio = 0.1 if recall else 0.0  # 0: recall off
    return small_window_settings(sim, recall_budget_ratio=ratio, summary_max_tokens=600)


def test_facts_a_summary_dropped_come_back_as_excerpts(
    forgetful_sim: str, start_proxy: Any
) -> None:
    """≥ 27/30 answered right and ≤ 2 with another fact's value, after 200 turns."""
    url = start_proxy(settings(forgetful_sim, recall=True))
    chat = Chat(url, session="recall-on")
    facts = facts_for(TURNS)
    assert len(facts) == 120
    play(chat, facts)
    assert chat.statuses["compacted"] >= 5
    right, wrong, recalled = ask(chat, facts)
    assert right >= 27, (right, recalled)
    assert wrong <= 2
    assert min(recalled) >= 0  # every question's view was searched
    assert exact_metric(url, "compaction_proxy_recalled_excerpts_total") >= right
    assert metric(url, "compaction_proxy_archive_writes_total", outcome="archived") >= 5
    _assert_prefix_stable(chat_requests(forgetful_sim))


@pytest.fixture
def echoing_sim() -> Iterator[str]:
    """A 4k model whose summaries only copy their prompt: every one is rejected, so no
    snapshot is ever stored and every view past the trigger is trimmed."""
    rule = ModelRule(match="sim-4k", summary_style="echo")
    with run_server(create_simulator_app(SimulatorConfig(models=(rule,)))) as url:
        yield url


def test_facts_a_trimmed_view_dropped_come_back_when_no_summary_is_stored(
    echoing_sim: str, start_proxy: Any
) -> None:
    """Nothing is archived by a compaction (none succeeds), yet the turns the trimmed view
    leaves out are searched from the request itself, and archived."""
    url = start_proxy(settings(echoing_sim, recall=True))
    chat = Chat(url, session="trimmed")
    facts = facts_for(TURNS)
    play(chat, facts)
    assert chat.statuses["trimmed"] >= 100
    assert not chat.statuses["compacted"]
    assert metric(url, "compaction_proxy_summary_failures_total") >= 1
    right, wrong, recalled = ask(chat, facts)
    assert right >= 27, (right, recalled)
    assert wrong <= 2
    assert metric(url, "compaction_proxy_archive_writes_total", outcome="archived") >= 1
    assert session_info(url, "trimmed").get("version", 0) == 0  # no summary was ever stored
    _assert_prefix_stable(chat_requests(echoing_sim))


def test_without_recall_the_same_conversation_loses_the_facts(
    forgetful_sim: str, start_proxy: Any
) -> None:
    """The control: the same turns with recall off answer few (what recall adds)."""
    url = start_proxy(settings(forgetful_sim, recall=False))
    chat = Chat(url, session="recall-off")
    facts = facts_for(TURNS)
    play(chat, facts)
    right, _, recalled = ask(chat, facts)
    assert right < 27
    assert set(recalled) == {-1}  # no header: recall did not look


def _assert_prefix_stable(requests: list[dict[str, Any]]) -> None:
    """Between two compactions each request is the one before it, byte for byte, and its
    new turns (the block stays where it was), but where the new turn has excerpts of its
    own: then the block moves to open it and the rest is as before. A block only ever
    opens a user message after the summary, and adds no turn."""
    compared = strict = with_excerpts = 0
    previous: list[bytes] | None = None
    previous_messages: list[dict[str, Any]] = []
    previous_handoff: bytes | None = None
    for request in requests:
        messages = request["body"]["messages"]
        encoded = [orjson.dumps(m) for m in messages]
        handoff = next((e for m, e in zip(messages, encoded, strict=True) if _is_handoff(m)), None)
        blocks = [
            i
            for i, m in enumerate(messages)
            if str(m.get("content")).startswith("Verbatim excerpts")
        ]
        for i in blocks:
            assert messages[i]["role"] == "user"
            assert handoff is not None
            assert encoded.index(handoff) < i  # after the summary
        assert len(blocks) <= 1  # one block at a time
        with_excerpts += bool(blocks)
        if previous is not None and handoff is not None and handoff == previous_handoff:
            compared += 1
            if encoded[: len(previous)] == previous:
                strict += 1
            else:  # the block moved: only to this turn's new one; the rest as before
                assert blocks, "a block left out with no new one"
                assert blocks[-1] == len(messages) - 1
                assert _unblocked(messages)[: len(previous)] == _unblocked(previous_messages)
        previous, previous_handoff, previous_messages = encoded, handoff, messages
    assert compared >= 20
    assert strict >= 20  # the turns with nothing new to recall
    assert with_excerpts >= 27


def _unblocked(messages: list[dict[str, Any]]) -> list[bytes]:
    """The messages as the client sent them: excerpt blocks taken out."""
    return [orjson.dumps(m) for m in without_excerpts(messages)]


def _is_handoff(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(HANDOFF_INTRO)


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_excerpts_come_back_on_every_api_in_its_own_shape(
    forgetful_sim: str, start_proxy: Any, api: str
) -> None:
    """Chat completions, Messages and Responses: a fact the summary dropped is answered
    from the excerpt block, which reaches the upstream right before the newest user
    message, as that API writes a user turn."""
    from tests.e2e.test_cross_api import Client

    url = start_proxy(settings(forgetful_sim, recall=True))
    client = Client(url)
    for n in range(36):
        fact = f" Remember this one: FACT item_{n}=code{n * 13}x for later." if n % 4 == 0 else ""
        client.say(api, f"Turn {n}: {FILLER * 3}{fact}")
    assert any(t.status == "compacted" for t in client.log)
    assert client.say(api, "What was item_4 again? RECALL item_4") == "item_4=code52x"
    last = chat_requests(forgetful_sim)[-1]["body"]  # the question's, in its API's shape
    turns = last["input"] if api == "responses" else last["messages"]
    assert ("system" in last) == (api == "messages")
    assert isinstance(turns, list)
    # No assistant turn the client did not send (a small model copied the proxy's own
    # acknowledgement as its answers): the block opens the newest user turn (chat,
    # Messages), or is the one input message right before it (Responses).
    assert all(
        _text_of(t) != "Noted: the excerpts above are quoted from earlier in this conversation."
        for t in turns
    )
    newest = turns[-1]
    assert newest["role"] == "user"
    assert "RECALL item_4" in _text_of(newest)
    block = turns[-2] if api == "responses" else newest
    assert block["role"] == "user"
    assert _text_of(block).startswith("Verbatim excerpts")
    assert "FACT item_4=code52x" in _text_of(block)
    if api != "responses":  # one user turn: the block, then the client's words
        assert turns[-2]["role"] == "assistant"
        assert _text_of(newest).index("end]") < _text_of(newest).index("RECALL item_4")


def _text_of(turn: dict[str, Any]) -> str:
    content = turn.get("content")
    if isinstance(content, str):
        return content
    assert isinstance(content, list)
    return "".join(str(part.get("text", "")) for part in content)


@pytest.mark.redis
def test_on_redis_the_archive_is_encrypted_per_tenant_and_deleted_with_the_session(
    forgetful_sim: str, start_proxy: Any, redis_server: Any
) -> None:
    """Through the proxy on a real redis-server with store.encryption_keys: no archived
    text in any key's raw value; another tenant's session of the same name recalls
    nothing of it; DELETE /sessions/{id} removes the archive."""
    import httpx
    import redis
    from cryptography.fernet import Fernet

    store = {"url": redis_server.url, "encryption_keys": [Fernet.generate_key().decode()]}
    model = {"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 256}
    compaction = {"summary_max_tokens": 600, "precompact_ratio": None}
    url = start_proxy(
        proxy_settings(forgetful_sim, models=[model], compaction=compaction, store=store)
    )
    owner = Chat(url, key="sk-tenant-a", session="shared-name")
    for n in range(30):
        fact = " Note: FACT vault_code=Zephyr4471 for the record." if n == 2 else ""
        owner.say(f"Turn {n}: {FILLER}{fact}")
    assert owner.statuses["compacted"] >= 1
    assert owner.say("The vault_code? RECALL vault_code") == "vault_code=Zephyr4471"
    stranger = Chat(url, key="sk-tenant-b", session="shared-name")
    for n in range(30):
        stranger.say(f"Turn {n}: {FILLER}")
    assert stranger.say("The vault_code? RECALL vault_code") == "vault_code=UNKNOWN"
    raw = redis.Redis.from_url(redis_server.url)
    try:
        values = _raw_values(raw)
        assert values
        assert not any(b"Zephyr4471" in v or b"careful notes" in v for v in values)
        assert len(list(raw.scan_iter("cp:arch:*"))) == 2  # one per tenant
        deleted = httpx.delete(
            f"{url}/sessions/shared-name", headers={"Authorization": "Bearer sk-tenant-a"}
        )
        assert deleted.status_code == 200
        assert len(list(raw.scan_iter("cp:arch:*"))) == 1  # the other tenant's stays
    finally:
        raw.close()


def _raw_values(raw: Any) -> list[bytes]:
    values: list[bytes] = []
    for name in raw.scan_iter("*"):
        kind = raw.type(name)
        if kind == b"list":
            values += raw.lrange(name, 0, -1)
        elif kind == b"hash":
            values += [v for kv in raw.hgetall(name).items() for v in kv]
        elif kind == b"zset":
            values += [m for m, _ in raw.zrange(name, 0, -1, withscores=True)]
        elif kind == b"string":
            values.append(raw.get(name))
    return values
