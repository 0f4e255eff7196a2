"""Recall by tool: a fact only the archive of originals holds (the summarizer here keeps no
fact, and excerpts are off) comes back through the proxy's own recall tool, which the
model calls as a real one would (the simulator: a ``RECALL <key>`` for a key its prompt
does not state, with a tool that says it searches the earlier conversation). The proxy
answers the call and asks again before the client sees a byte: on chat completions,
Responses and Messages, streamed and not, through the official SDKs, the client's
response holds no trace of the tool, its call or its result.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest

from proxy.config import CompactionSettings
from proxy.core.recall_tool import TOOL_NAME
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, TOOLS, WINDOW, chat_requests, small_window_settings
from tests.support.metrics import metric
from tests.support.servers import OPEN_CLIENTS, run_server

SYSTEM = "You are a careful assistant."
FACT_TURN = 4
QUESTION = "What was item_4 again? RECALL item_4"
ANSWER = "item_4=code52x"
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
MESSAGES_TOOLS = [
    {"name": t["function"]["name"], "description": "", "input_schema": t["function"]["parameters"]}
    for t in TOOLS
]
APIS = ("chat", "responses", "messages")
# Recall by excerpts off: `recall: false` here, `recall_budget_ratio: 0` where that key is gone.
EXCERPTS_OFF = (
    {"recall": False} if "recall" in CompactionSettings.model_fields else {"recall_budget_ratio": 0}
)


@pytest.fixture
def forgetful_sim() -> Iterator[str]:
    """A 4k model whose summaries carry no fact at all."""
    rule = ModelRule(match="sim-4k", summary_style="ideal", summary_forgets=1)
    with run_server(create_simulator_app(SimulatorConfig(models=(rule,)))) as url:
        yield url


def settings(sim: str, rounds: int = 2) -> Any:
    """Excerpts and restored identifiers off: what the summary dropped comes back through
    the tool (its calls answered up to ``rounds`` times a turn; 0: off), or not at all."""
    return small_window_settings(
        sim,
        recall_tool_rounds=rounds,
        summary_max_tokens=600,
        restored_identifiers_max=0,
        **EXCERPTS_OFF,
    )


@dataclass
class Conversation:
    """One user's conversation, sent whole on one API with the client's own tools; what
    the client received of each answer is kept (every event of a stream) as text."""

    base: str
    api: str
    session: str
    tools: bool = True
    sim_headers: dict[str, str] = field(default_factory=dict)  # X-Sim-* for every request
    turns: list[tuple[str, str]] = field(default_factory=list)
    received: list[str] = field(default_factory=list)
    headers: Any = None

    def __post_init__(self) -> None:
        key = "sk-recall-tool"
        self.openai = openai.OpenAI(base_url=f"{self.base}/v1", api_key=key, max_retries=0)
        self.anthropic = anthropic.Anthropic(
            base_url=self.base, api_key=None, default_headers={"x-api-key": key}, max_retries=0
        )
        OPEN_CLIENTS.extend([self.openai, self.anthropic])

    def say(self, text: str, stream: bool = False) -> str:
        self.turns.append(("user", text))
        extra = {"X-Session-Id": self.session, "X-Sim-Context-Window": str(WINDOW)}
        extra.update(self.sim_headers)
        reply = getattr(self, self.api)(extra, stream)
        self.turns.append(("assistant", reply))
        return str(reply)

    def chat(self, extra: dict[str, str], stream: bool) -> str:
        messages = [{"role": "system", "content": SYSTEM}]
        messages += [{"role": r, "content": t} for r, t in self.turns]
        tools: Any = {"tools": TOOLS} if self.tools else {}
        raw = self.openai.chat.completions.with_raw_response.create(
            model="sim-4k", messages=messages, extra_headers=extra, stream=stream, **tools
        )
        self.headers = raw.headers
        if not stream:
            parsed = raw.parse()
            self.received.append(parsed.model_dump_json())
            return parsed.choices[0].message.content or ""
        text = ""
        for chunk in raw.parse():
            self.received.append(chunk.model_dump_json())
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text

    def responses(self, extra: dict[str, str], stream: bool) -> str:
        items: list[Any] = []
        for role, text in self.turns:
            if role == "user":
                items.append({"role": "user", "content": text})
            else:
                part = {"type": "output_text", "text": text, "annotations": []}
                items.append({"type": "message", "role": "assistant", "content": [part]})
        tools: Any = {"tools": RESPONSES_TOOLS} if self.tools else {}
        raw = self.openai.responses.with_raw_response.create(
            model="sim-4k",
            instructions=SYSTEM,
            input=items,
            store=False,
            extra_headers=extra,
            stream=stream,
            **tools,
        )
        self.headers = raw.headers
        if not stream:
            parsed = raw.parse()
            self.received.append(parsed.model_dump_json())
            return parsed.output_text
        text = ""
        for event in raw.parse():
            self.received.append(event.model_dump_json())
            if event.type == "response.output_text.delta":
                text += event.delta
        return text

    def messages(self, extra: dict[str, str], stream: bool) -> str:
        messages = [{"role": r, "content": t} for r, t in self.turns]
        tools: Any = {"tools": MESSAGES_TOOLS} if self.tools else {}
        raw = self.anthropic.messages.with_raw_response.create(
            model="sim-4k",
            max_tokens=256,
            system=SYSTEM,
            messages=messages,  # type: ignore[arg-type]
            extra_headers=extra,
            stream=stream,
            **tools,
        )
        self.headers = raw.headers
        if not stream:
            parsed = raw.parse()
            self.received.append(parsed.model_dump_json())
            return "".join(b.text for b in parsed.content if b.type == "text")
        text = ""
        for event in raw.parse():
            self.received.append(event.model_dump_json())
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        return text


def played(conversation: Conversation, turns: int = 36) -> Conversation:
    """Turns enough for a few compactions, a fact stated early (then summarized away)."""
    for n in range(turns):
        fact = f" Remember this one: FACT item_{n}=code{n * 13}x for later." if n % 4 == 0 else ""
        conversation.say(f"Turn {n}: {FILLER * 3}{fact}")
    assert conversation.headers["x-compaction-status"] in ("snapshot", "compacted")
    return conversation


def assert_no_trace(conversation: Conversation) -> None:
    """Nothing the client received names the tool or quotes its result."""
    for text in conversation.received:
        assert TOOL_NAME not in text
        assert "_recall" not in text  # the simulator's id for its call of the tool
        assert "Verbatim excerpts" not in text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_a_fact_only_the_archive_holds_comes_back_through_the_tool(
    forgetful_sim: str, start_proxy: Any, api: str, stream: bool
) -> None:
    url = start_proxy(settings(forgetful_sim))
    conversation = played(Conversation(url, api, f"tool-{api}-{stream}"))
    assert conversation.say(QUESTION, stream=stream) == ANSWER
    assert conversation.headers["x-compaction-recall-tool"] == "1"
    assert_no_trace(conversation)
    asked, answered = chat_requests(forgetful_sim)[-2:]  # the call, then its result
    assert TOOL_NAME in str(asked["body"]["tools"])
    assert "FACT item_4=code52x" in str(answered["body"])
    assert metric(url, "compaction_proxy_recall_tool_total", outcome="answered") == 1


@pytest.mark.parametrize("api", APIS)
def test_a_stream_that_thinks_first_is_read_whole_too(
    forgetful_sim: str, start_proxy: Any, api: str
) -> None:
    """A stream that opens with comments (a model thinking) is not started early when the
    recall tool is on: its call never reaches the client either."""
    url = start_proxy(settings(forgetful_sim))
    conversation = played(Conversation(url, api, f"thinking-{api}"))
    conversation.sim_headers = {"X-Sim-Thinking-Ms": "30", "X-Sim-Comment-Interval-Ms": "10"}
    assert conversation.say(QUESTION, stream=True) == ANSWER
    assert conversation.headers["x-compaction-recall-tool"] == "1"
    assert_no_trace(conversation)


@pytest.mark.parametrize("api", APIS)
def test_without_the_tool_the_fact_is_lost(forgetful_sim: str, start_proxy: Any, api: str) -> None:
    """The control: the recall tool off (the default), the same turns answer UNKNOWN."""
    url = start_proxy(settings(forgetful_sim, rounds=0))
    conversation = played(Conversation(url, api, f"off-{api}"))
    assert conversation.say(QUESTION) == "item_4=UNKNOWN"
    assert "x-compaction-recall-tool" not in conversation.headers
    assert TOOL_NAME not in str(chat_requests(forgetful_sim)[-1]["body"])


def test_a_model_configured_without_the_tool_never_gets_it(
    forgetful_sim: str, start_proxy: Any
) -> None:
    """``models[].recall_tool: false``: on for the tenant, off for that model."""
    base = settings(forgetful_sim)
    model = base.models[0].model_copy(update={"recall_tool": False})
    url = start_proxy(base.model_copy(update={"models": [model]}))
    conversation = played(Conversation(url, "chat", "model-off"))
    assert conversation.say(QUESTION) == "item_4=UNKNOWN"
    assert "x-compaction-recall-tool" not in conversation.headers
    assert TOOL_NAME not in str(chat_requests(forgetful_sim)[-1]["body"])


def test_a_client_tool_of_the_same_name_wins(forgetful_sim: str, start_proxy: Any) -> None:
    """The client declares a tool named as the proxy's: the proxy adds nothing, and the
    model's call of it goes to the client, as the client's own."""
    url = start_proxy(settings(forgetful_sim))
    conversation = played(Conversation(url, "chat", "same-name"))
    own = {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "The client's own search of the earlier conversation.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    messages: Any = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": r, "content": t} for r, t in conversation.turns]
    messages.append({"role": "user", "content": QUESTION})
    raw = conversation.openai.chat.completions.with_raw_response.create(
        model="sim-4k",
        messages=messages,
        tools=[*TOOLS, own],
        extra_headers={"X-Session-Id": "same-name", "X-Sim-Context-Window": str(WINDOW)},
    )
    message = raw.parse().choices[0].message
    assert message.tool_calls is not None
    assert [c.function.name for c in message.tool_calls] == [TOOL_NAME]  # the client's
    assert "x-compaction-recall-tool" not in raw.headers
    tools = chat_requests(forgetful_sim)[-1]["body"]["tools"]
    assert [t["function"]["name"] for t in tools] == ["read_file", TOOL_NAME]  # as sent
    assert metric(url, "compaction_proxy_recall_tool_total", outcome="client_tool") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_rounds_are_bounded(forgetful_sim: str, start_proxy: Any, api: str, stream: bool) -> None:
    """A key nowhere in the archive: the model searches after every result; after
    ``recall_tool_rounds`` the proxy asks with tool_choice none, and the client gets the
    model's answer, in its API's shape, with no trace of the tool."""
    url = start_proxy(settings(forgetful_sim, rounds=2))
    conversation = played(Conversation(url, api, f"bounded-{api}-{stream}"))
    answer = conversation.say("And the item_999? RECALL item_999", stream=stream)
    assert answer == "item_999=UNKNOWN"
    assert conversation.headers["x-compaction-recall-tool"] == "2"
    assert_no_trace(conversation)
    last = chat_requests(forgetful_sim)[-1]["body"]
    assert last["tool_choice"] in ("none", {"type": "none"})
    assert metric(url, "compaction_proxy_recall_tool_total", outcome="exhausted") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_an_answer_that_also_calls_the_clients_tools_is_asked_again_without_ours(
    forgetful_sim: str, start_proxy: Any, api: str, stream: bool
) -> None:
    """The model calls the client's tool and the recall tool in one answer: the proxy
    asks again without its tool, and the client gets a turn of its own tool's calls."""
    url = start_proxy(settings(forgetful_sim))
    conversation = played(Conversation(url, api, f"mixed-{api}-{stream}"))
    conversation.say(f"CALL 1 and {QUESTION}", stream=stream)
    assert conversation.headers["x-compaction-recall-tool"] == "0"
    assert_no_trace(conversation)
    assert any("read_file" in text for text in conversation.received)
    mixed, again = chat_requests(forgetful_sim)[-2:]
    assert TOOL_NAME in str(mixed["body"]["tools"])
    assert TOOL_NAME not in str(again["body"])
    assert metric(url, "compaction_proxy_recall_tool_total", outcome="mixed") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_a_model_that_keeps_calling_after_tool_choice_none_gets_a_502(
    forgetful_sim: str, start_proxy: Any, api: str, stream: bool
) -> None:
    """A model that ignores ``tool_choice: none`` (a small one may): the client gets the
    proxy's 502 in the API's own error shape, before any byte of a stream."""
    url = start_proxy(settings(forgetful_sim, rounds=1))
    conversation = played(Conversation(url, api, f"refused-{api}-{stream}"))
    conversation.sim_headers = {"X-Sim-Ignore-Tool-Choice": "1"}
    errors = anthropic.APIStatusError if api == "messages" else openai.APIStatusError
    with pytest.raises(errors) as raised:
        conversation.say("And the item_999? RECALL item_999", stream=stream)
    assert raised.value.status_code == 502
    body = raised.value.response.json()
    if api == "messages":  # Anthropic's shape: {"type": "error", "error": {type, message}}
        assert body["type"] == "error"
        assert body["error"]["type"] == "api_error"
        assert "recall tool" in body["error"]["message"]
    else:
        assert body["error"]["code"] == "recall_tool_refused"
    assert TOOL_NAME not in raised.value.response.text
    assert metric(url, "compaction_proxy_recall_tool_total", outcome="refused") == 1
