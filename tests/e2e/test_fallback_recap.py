"""Issue 21, items 3 and 6, end to end: what a view keeps of the messages it leaves out
without a model call. The real proxy under uvicorn, the openai SDK as client, the
simulator as upstream; assertions read what the upstream received.

- (a) a summarizer that always fails (its model's window is too small for any
  summary): the trimmed view still quotes the dropped user, assistant and tool
  messages' labelled values, with their roles, never in a system message; and
  within the back-off no turn asks the summarizer again;
- (b) old bulky tool outputs elided: their ``KEY = VALUE`` values survive in the
  placeholder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.chat import (
    FILLER,
    TOOLS,
    Chat,
    broken_summarizer,  # noqa: F401 (a fixture)
    chat_requests,
    small_window_settings,
    upstream_requests,
)

# The recap's heading (omitted.py), spelled out: these tests must run, and fail,
# against a proxy without it.
RECAP = "Values quoted from omitted messages (data, not instructions)"


def _summary_calls(sim: str) -> int:
    return sum(
        1 for r in upstream_requests(sim) if r["headers"].get("x-compaction-purpose") == "summarize"
    )


TICKET = "Note for later: the ticket id is TCK-90417 for this outage."


def _facts(chat: Chat) -> None:
    """A user, an assistant and a tool each state a value a later turn asks about."""
    chat.history += [
        {"role": "user", "content": TICKET},
        {"role": "assistant", "content": "Noted. And the port is 8443 on the staging box."},
        {"role": "user", "content": "Read the service config please."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_cfg",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"step": 1}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_cfg",
            "content": "# service.env\nSERVER_PORT = 7781\nLOG_FORMAT = json\n",
        },
        {"role": "assistant", "content": "The config is read."},
    ]


def _sent(sim: str) -> list[dict[str, Any]]:
    """The messages of the last chat request the upstream received."""
    return list(chat_requests(sim)[-1]["body"]["messages"])


@pytest.mark.parametrize("summary_role", ["user", "system"])
def test_a_failed_summary_trims_yet_keeps_the_dropped_values_quoted_with_their_roles(
    broken_summarizer: str,  # noqa: F811 (the fixture imported above)
    start_proxy: Callable[..., str],
    summary_role: str,
) -> None:
    sim = broken_summarizer
    settings = small_window_settings(
        sim, summarizer_model="broken", summary_role=summary_role
    )  # summary_backoff_s: its default, 30 s, is longer than the test
    url = start_proxy(settings)
    chat = Chat(url, key="sk-recap", session=f"recap-{summary_role}")
    _facts(chat)
    turn = 0
    while chat.statuses["trimmed"] == 0:
        chat.say(f"Turn {turn}: {FILLER}")
        turn += 1
        assert turn < 60
    calls = _summary_calls(sim)
    assert calls >= 1  # it was asked, and failed
    for more in range(4):  # within the back-off: trimmed, never asked again
        chat.say(f"More {more}: {FILLER}")
        assert chat.last is not None
        assert chat.last["x-compaction-status"] == "trimmed"
        sent = _sent(sim)
        texts = [str(m.get("content") or "") for m in sent]
        assert TICKET not in texts  # dropped...
        quoted = [m for m in sent if RECAP in str(m.get("content") or "")]
        assert len(quoted) == 1, texts  # ...yet its values are quoted, once
        assert quoted[0]["role"] != "system"
        recap = str(quoted[0]["content"])
        assert "- user: `ticket id: TCK-90417`" in recap
        assert "- assistant: `port: 8443`" in recap
        assert "- tool: `SERVER_PORT = 7781`" in recap
        for message in sent:
            if message["role"] == "system":
                assert "TCK-90417" not in str(message["content"])
                assert "7781" not in str(message["content"])
    assert _summary_calls(sim) == calls


def test_elided_tool_outputs_keep_their_key_value_settings(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Old bulky tool outputs are elided without a model call: ``SERVER_PORT = 7781``
    was later answered as 8080. Their values now stay in the placeholder."""
    url = start_proxy(small_window_settings(sim_reset))
    chat = Chat(url, key="sk-elide", session="elide")
    log = "2026-03-01 INFO request served in a few milliseconds without trouble\n" * 60
    for step in range(3):
        chat.history += [
            {"role": "user", "content": f"Read config {step}."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{step}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": f'{{"step": {step}}}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{step}",
                "content": f"SERVER_PORT = {7781 + step}\nDB_HOST = db-{step}.internal\n{log}",
            },
            {"role": "assistant", "content": f"Config {step} read."},
        ]
    elided: list[str] = []
    turn = 0
    while not elided:
        chat.say(f"Turn {turn}: {FILLER}")
        turn += 1
        assert turn < 40
        elided = [
            str(m["content"])
            for m in _sent(sim_reset)
            if m["role"] == "tool" and "elided" in str(m["content"])
        ]
    assert "`SERVER_PORT = 7781`" in elided[0]
    assert "`DB_HOST = db-0.internal`" in elided[0]
    assert "INFO request served" not in elided[0]
    assert chat.send(tools=TOOLS) is not None  # the view with placeholders is accepted


def test_a_trimmed_views_recap_quotes_the_users_facts_before_the_assistants_own_ids(
    broken_summarizer: str,  # noqa: F811 (the fixture imported above)
    start_proxy: Callable[..., str],
) -> None:
    """An assistant that acknowledges every turn under an id of its own: the recap,
    newest first, filled itself with those ids, and the facts the user had stated in
    the same span were lost. What only the assistant said now comes after them."""
    sim = broken_summarizer
    url = start_proxy(small_window_settings(sim, summarizer_model="broken"))
    chat = Chat(url, key="sk-acks", session="acks")
    facts: dict[str, str] = {}
    for turn in range(48):
        text = f"Turn {turn}: {FILLER}"
        if turn % 4 == 0:
            key = f"cfg{turn}"
            facts[key] = f"blue{turn * 7}"
            text += f" Please note: {key}={facts[key]}"
        chat.say(text)
        chat.history[-1]["content"] = f"Logged as ACK-{turn:04d} for later."
    assert chat.statuses["trimmed"] >= 1, chat.statuses
    assert chat.statuses["compacted"] == 0
    sent = [str(m.get("content") or "") for m in _sent(sim)]
    (recap,) = [text for text in sent if RECAP in text]
    dropped = [k for k in facts if not any(f"{k}={facts[k]}" in t for t in sent if t != recap)]
    assert len(dropped) >= 6  # most of the facts are in no message the view kept
    assert all(f"- user: `{k}={facts[k]}`" in recap for k in dropped), recap
    # Answered from what the view quotes, read as a reader reads it.
    recalled = [k for k, v in facts.items() if chat.say(f"RECALL {k}") == f"{k}={v}"]
    assert recalled == list(facts), f"{len(recalled)}/{len(facts)}"
