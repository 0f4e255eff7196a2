"""Issue 3 end to end: real proxy, openai SDK as client, the simulator as upstream."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest
from pydantic import SecretStr

from proxy.config import SessionSettings
from proxy.core.wording import handoff_text
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import (
    FILLER,
    TOOLS,
    WINDOW,
    Chat,
    chat_requests,
    small_window_settings,
    stats,
    upstream_requests,
)
from tests.support.servers import proxy_settings, run_server


@pytest.fixture
def proxy4k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return start_proxy(small_window_settings(sim_reset))


def test_150_turns_in_a_4k_window_keep_every_fact(proxy4k: str, sim_reset: str) -> None:
    chat = Chat(proxy4k, session="long")
    for turn in range(140):
        fact = f" FACT k{turn}=v{turn * 7}" if turn % 10 == 0 else ""
        chat.say(f"Turn {turn}: {FILLER}{fact}")
    for i in range(10):
        assert chat.say(f"RECALL k{i * 10}") == f"k{i * 10}=v{i * 70}"
    sim = stats(sim_reset)
    assert sim["overflows"] == 0
    assert sim["rejected_structure"] == 0
    assert 1 <= sim["summaries"] <= 150 // 10
    assert chat.statuses["compacted"] >= 1
    assert chat.statuses["snapshot"] > chat.statuses["compacted"] * 5


def test_prefix_is_byte_identical_between_compactions(proxy4k: str, sim_reset: str) -> None:
    chat = Chat(proxy4k, session="prefix")
    versions = []
    for turn in range(60):
        chat.say(f"Turn {turn}: {FILLER}")
        assert chat.last is not None
        versions.append(int(chat.last["x-compaction-version"]))
    forwarded = chat_requests(sim_reset)
    assert len(forwarded) == 60
    by_version: dict[int, set[bytes]] = {}
    for version, request in zip(versions, forwarded, strict=True):
        if version == 0:
            continue
        messages = request["body"]["messages"]
        # Pinned system message + the handoff messages before the verbatim tail.
        cut = next(i for i, m in enumerate(messages) if m["content"].startswith("Turn"))
        by_version.setdefault(version, set()).add(orjson.dumps(messages[:cut]))
    assert len(by_version) >= 2, "the conversation should compact more than once"
    for version, prefixes in by_version.items():
        assert len(prefixes) == 1, f"prefix changed within snapshot version {version}"


def test_agent_loop_with_parallel_tools_and_strict_alternation(
    proxy4k: str, sim_reset: str
) -> None:
    chat = Chat(proxy4k, session="agent", headers={"X-Sim-Strict-Alternation": "1"})
    chat.history.append({"role": "user", "content": "Start the task. FACT task=ingest CALL 3"})
    for step in range(40):
        message = chat.send(tools=TOOLS)
        assert message.tool_calls, f"step {step}: expected tool calls, got {message.content!r}"
        chat.history.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            output = f"result of {call.id}: " + "line of file content\n" * 150
            chat.history.append({"role": "tool", "tool_call_id": call.id, "content": output})
        reply = chat.send(tools=TOOLS)
        chat.history.append({"role": "assistant", "content": reply.content})
        chat.history.append({"role": "user", "content": f"Continue with step {step}. CALL 2"})
    chat.history[-1]["content"] = "RECALL task"
    assert chat.send(tools=TOOLS).content == "task=ingest"
    sim = stats(sim_reset)
    assert sim["rejected_structure"] == 0
    assert sim["overflows"] == 0
    assert chat.statuses["compacted"] >= 1


def test_rewound_history_never_sees_the_discarded_branch(proxy4k: str, sim_reset: str) -> None:
    chat = Chat(proxy4k, session="rewind")
    for turn in range(30):
        chat.say(f"Turn {turn}: {FILLER}")
    branch_point = len(chat.history)
    for turn in range(30, 70):
        secret = " FACT secret=alpha" if turn == 31 else ""
        chat.say(f"Turn {turn}: {FILLER}{secret}")
    assert chat.say("RECALL secret") == "secret=alpha"
    assert chat.statuses["compacted"] >= 2

    httpx.delete(f"{sim_reset}/_sim/requests")
    del chat.history[branch_point:]  # the user rewinds and takes another path
    chat.say("FACT secret=beta and let us go another way.")
    for turn in range(40):
        chat.say(f"Branch turn {turn}: {FILLER}")
    assert chat.say("RECALL secret") == "secret=beta"
    for request in upstream_requests(sim_reset):
        assert b"alpha" not in orjson.dumps(request["body"])


def test_edited_early_message_drops_the_stale_summary(proxy4k: str, sim_reset: str) -> None:
    chat = Chat(proxy4k, session="edit")
    chat.say(f"FACT color=red {FILLER}")
    for turn in range(40):
        chat.say(f"Turn {turn}: {FILLER}")
    assert chat.statuses["compacted"] >= 1
    httpx.delete(f"{sim_reset}/_sim/requests")
    chat.history[1]["content"] = f"FACT color=green {FILLER}"  # edited in place
    assert chat.say("RECALL color") == "color=green"
    for request in upstream_requests(sim_reset):
        assert b"color=red" not in orjson.dumps(request["body"])


def test_tenants_sharing_a_session_id_never_see_each_other(proxy4k: str, sim_reset: str) -> None:
    alice = Chat(proxy4k, key="sk-alice", session="shared-id")
    bob = Chat(proxy4k, key="sk-bob", session="shared-id")
    alice.say("FACT owner=alice")
    bob.say("FACT owner=bob")
    for turn in range(40):
        alice.say(f"Alice turn {turn}: {FILLER}")
        bob.say(f"Bob turn {turn}: {FILLER}")
    assert alice.say("RECALL owner") == "owner=alice"
    assert bob.say("RECALL owner") == "owner=bob"
    for request in upstream_requests(sim_reset):
        body = orjson.dumps(request["body"])
        token = request["headers"]["authorization"]
        other = b"owner=bob" if token == "Bearer sk-alice" else b"owner=alice"
        assert other not in body

    def session(key: str) -> httpx.Response:
        return httpx.get(f"{proxy4k}/sessions/shared-id", headers={"Authorization": key})

    assert "owner=alice" in session("Bearer sk-alice").json()["summary"]
    assert "owner=bob" in session("Bearer sk-bob").json()["summary"]
    assert session("Bearer sk-mallory").status_code == 404


def test_headerless_conversations_sharing_a_system_prompt_stay_apart(
    proxy4k: str, sim_reset: str
) -> None:
    first, second = Chat(proxy4k), Chat(proxy4k)
    first.say("I am the first conversation. FACT who=first")
    second.say("I am the second conversation. FACT who=second")
    for turn in range(40):
        first.say(f"First turn {turn}: {FILLER}")
        second.say(f"Second turn {turn}: {FILLER}")
    assert first.say("RECALL who") == "who=first"
    assert second.say("RECALL who") == "who=second"
    assert first.statuses["compacted"] >= 1
    assert second.statuses["compacted"] >= 1


def test_headerless_conversations_with_identical_openings_keep_their_own_snapshots(
    proxy4k: str, sim_reset: str
) -> None:
    # A temperature-0 agent with a fixed kickoff: same system prompt, same first message,
    # so the same first reply; the two runs part only at turn 2.
    first, second = Chat(proxy4k), Chat(proxy4k)
    assert first.say("Start the nightly job.") == second.say("Start the nightly job.")
    first.say(f"FACT who=first {FILLER}")
    second.say(f"FACT who=second {FILLER}")
    for turn in range(45):
        first.say(f"Turn {turn}: {FILLER}")
        second.say(f"Turn {turn}: {FILLER}")
    assert first.say("RECALL who") == "who=first"
    assert second.say("RECALL who") == "who=second"
    for chat in (first, second):
        assert chat.statuses["compacted"] >= 2
        # Sharing one snapshot, each would find the other's and summarize every turn.
        assert chat.statuses["snapshot"] > chat.statuses["compacted"] * 3
    assert stats(sim_reset)["summaries"] <= 20


def test_prompt_cache_key_and_configured_body_fields_name_the_session(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    settings = small_window_settings(sim_reset)
    fields = ["metadata.session_id", "user"]
    proxy = start_proxy(
        settings.model_copy(update={"session": SessionSettings(body_fields=fields)})
    )
    named = {
        "by-cache-key": {"prompt_cache_key": "by-cache-key", "user": "someone"},
        "by-metadata": {"metadata": {"session_id": "by-metadata"}, "user": "someone"},
        "by-user": {"user": "by-user"},
    }
    for name, body in named.items():
        chat = Chat(proxy)
        chat.history[0]["content"] = f"You are assistant {name}."  # apart if derived
        for turn in range(30):
            chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
            chat.history.append(
                {"role": "assistant", "content": chat.send(extra_body=body).content}
            )
        assert chat.statuses["compacted"] >= 1
        found = httpx.get(
            f"{proxy}/sessions/{name}", headers={"Authorization": "Bearer sk-tenant-a"}
        )
        assert found.status_code == 200, name
        assert found.json()["version"] >= 1


def test_compaction_off_and_force_headers(proxy4k: str, sim_reset: str) -> None:
    chat = Chat(proxy4k, session="control")
    for turn in range(8):
        chat.say(f"Turn {turn}: short")
    chat.headers["X-Compaction"] = "off"
    chat.say("still short")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "bypassed"
    chat.headers["X-Compaction"] = "force"
    chat.say("compact now")
    assert chat.last["x-compaction-status"] == "compacted"
    assert int(chat.last["x-compaction-version"]) == 1
    chat.say("and again, too soon")  # rate-limited: no second forced compaction
    assert chat.last["x-compaction-status"] == "snapshot"
    assert stats(sim_reset)["summaries"] == 1
    assert all("x-compaction" not in r["headers"] for r in upstream_requests(sim_reset))


def test_sessions_api_get_compact_delete(proxy4k: str, sim_reset: str) -> None:
    chat = Chat(proxy4k, key="sk-owner", session="api")
    auth = {"Authorization": "Bearer sk-owner"}
    chat.say("FACT plan=b")
    for turn in range(4):
        chat.say(f"Turn {turn}")
    # Seen, not compacted yet: the session is known, its figures so far, no summary.
    seen = httpx.get(f"{proxy4k}/sessions/api", headers=auth)
    assert seen.status_code == 200, seen.text
    info = seen.json()
    assert (info["version"], info["summary"], info["model"]) == (0, None, "sim-4k")
    # Its first turn's figures, or a later one's (written at most every REFRESH_S).
    assert 1 <= info["messages"] < len(chat.history)
    assert info["tokens"] > 0
    other = {"Authorization": "Bearer sk-someone-else"}
    assert httpx.get(f"{proxy4k}/sessions/api", headers=other).status_code == 404
    # No snapshot yet: nothing to schedule.
    assert httpx.post(f"{proxy4k}/sessions/api/compact", headers=auth).status_code == 404
    chat.headers["X-Compaction"] = "force"
    chat.say("compact now")
    del chat.headers["X-Compaction"]
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    for turn in range(3):
        chat.say(f"More {turn}")
    assert httpx.post(f"{proxy4k}/sessions/api/compact", headers=other).status_code == 404
    r = httpx.post(f"{proxy4k}/sessions/api/compact", headers=auth)
    assert r.status_code == 202
    summaries = stats(sim_reset)["summaries"]
    chat.say("next turn")
    assert chat.last["x-compaction-status"] == "compacted"
    assert stats(sim_reset)["summaries"] == summaries + 1
    chat.say("and the one after")  # the schedule was used up
    assert chat.last["x-compaction-status"] != "compacted"
    assert stats(sim_reset)["summaries"] == summaries + 1
    info = httpx.get(f"{proxy4k}/sessions/api", headers=auth).json()
    assert "FACT plan=b" in info["summary"]
    assert 1 < info["covered_messages"] < len(chat.history)
    assert httpx.delete(f"{proxy4k}/sessions/api", headers=auth).status_code == 200
    assert httpx.get(f"{proxy4k}/sessions/api", headers=auth).status_code == 404


@pytest.fixture
def broken_summarizer_sim() -> Iterator[str]:
    """A simulator whose summarizer model has a window too small to ever summarize."""
    config = SimulatorConfig(models=(ModelRule(match="tiny-summarizer", context_window=200),))
    with run_server(create_simulator_app(config)) as url:
        yield url


def test_failing_summarizer_trims_and_never_fails_the_request(
    broken_summarizer_sim: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        small_window_settings(broken_summarizer_sim, summarizer_model="tiny-summarizer")
    )
    chat = Chat(url, session="fallback")
    for turn in range(60):
        chat.say(f"Turn {turn}: {FILLER}")
    sim = stats(broken_summarizer_sim)
    assert sim["overflows"] >= 1  # the summarizer calls, each failing
    assert chat.statuses["trimmed"] >= 1
    assert chat.statuses["compacted"] == 0
    for request in chat_requests(broken_summarizer_sim):
        messages = request["body"]["messages"]
        assert messages[-1]["content"].startswith("Turn")
    trimmed = chat_requests(broken_summarizer_sim)[-1]["body"]["messages"]
    assert any("omitted" in str(m.get("content")) for m in trimmed)
    assert not any(str(m.get("content")).startswith(handoff_text("")[:20]) for m in trimmed[2:])


def test_azure_style_api_key_headers_separate_tenants(proxy4k: str, sim_reset: str) -> None:
    """Callers that send `api-key` instead of Authorization are still told apart."""

    def call(key: str, owner: str) -> httpx.Response:
        history = [
            {"role": "user", "content": f"FACT owner={owner}"},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "compact please"},
        ]
        return httpx.post(
            f"{proxy4k}/v1/chat/completions",
            json={"model": "sim-4k", "messages": history},
            headers={"api-key": key, "X-Session-Id": "same", "X-Compaction": "force"},
        )

    assert call("key-one", "one").headers["x-compaction-status"] == "compacted"
    assert call("key-two", "two").headers["x-compaction-status"] == "compacted"
    one = httpx.get(f"{proxy4k}/sessions/same", headers={"api-key": "key-one"})
    two = httpx.get(f"{proxy4k}/sessions/same", headers={"api-key": "key-two"})
    assert httpx.get(f"{proxy4k}/sessions/same").status_code == 404
    assert "owner=one" in one.json()["summary"]
    assert "owner=two" not in one.json()["summary"]
    assert "owner=two" in two.json()["summary"]
    assert "owner=one" not in two.json()["summary"]


def test_default_summary_budget_keeps_a_verbatim_tail_in_a_small_window(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """summary_max_tokens (2000 by default) must not crowd out the recent turns of a 4k model."""
    url = start_proxy(
        proxy_settings(
            sim_reset,
            models=[{"match": "sim-4k", "context_window": WINDOW, "max_output_tokens": 512}],
            compaction={"precompact_ratio": None},  # inline: the compacting turn says so
        )
    )
    chat = Chat(url, session="tail")
    for turn in range(60):
        chat.say(f"Turn {turn}: {FILLER}")
        if chat.statuses["compacted"]:
            break
    assert chat.statuses["compacted"] == 1
    sent = chat_requests(sim_reset)[-1]["body"]["messages"]
    verbatim = [m for m in sent if str(m.get("content", "")).startswith("Turn")]
    assert len(verbatim) >= 4, f"only {len(verbatim)} recent turns kept verbatim"
    summaries = [r for r in upstream_requests(sim_reset) if r not in chat_requests(sim_reset)]
    assert all(r["body"]["max_tokens"] <= 0.15 * WINDOW for r in summaries)


def test_admin_listing_shows_metadata_only_to_the_admin_key(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    settings = small_window_settings(sim_reset)
    settings = settings.model_copy(
        update={"server": settings.server.model_copy(update={"admin_key": SecretStr("adm-1")})}
    )
    url = start_proxy(settings)
    for who in ("sk-one", "sk-two"):
        chat = Chat(url, key=who, session=f"s-{who}")
        chat.say("FACT secret=hidden-from-admins")
        for turn in range(4):
            chat.say(f"Turn {turn}")
        chat.headers["X-Compaction"] = "force"
        chat.say("compact now")
    admin = {"Authorization": "Bearer adm-1"}
    listing = httpx.get(f"{url}/admin/sessions", headers=admin)
    assert listing.status_code == 200
    data = listing.json()["data"]
    assert len(data) == 2
    assert {d["version"] for d in data} == {1}
    assert len({d["tenant"] for d in data}) == 2
    assert "hidden-from-admins" not in listing.text
    assert "sk-one" not in listing.text  # neither the key nor the session id (s-sk-one)
    assert httpx.get(f"{url}/admin/sessions", params={"limit": 1}, headers=admin).json()["has_more"]
    assert (
        httpx.get(f"{url}/admin/sessions", headers={"Authorization": "Bearer x"}).status_code == 401
    )
    assert httpx.get(f"{url}/admin/sessions").status_code == 401


def test_admin_listing_is_off_without_an_admin_key(proxy4k: str) -> None:
    r = httpx.get(f"{proxy4k}/admin/sessions", headers={"Authorization": "Bearer anything"})
    assert r.status_code == 404
